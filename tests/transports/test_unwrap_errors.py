"""A connection's tasks end with one meshbus error, unless the connection is being cancelled."""

from __future__ import annotations

import anyio
import pytest

from meshbus import ProtocolError, TransportError
from meshbus.transports._connection import unwrap_errors

pytestmark = pytest.mark.anyio


async def connection_failing_with(*errors: Exception) -> None:
    """A connection's tasks, one raising each of ``errors``, under ``unwrap_errors``."""

    async def fail(exc: Exception) -> None:
        raise exc

    with unwrap_errors():
        async with anyio.create_task_group() as tg:
            for exc in errors:
                tg.start_soon(fail, exc)
            await anyio.sleep_forever()


async def test_the_first_meshbus_error_leaves_as_itself() -> None:
    with pytest.raises(TransportError, match="lost"):
        await connection_failing_with(TransportError("lost"))


async def test_an_error_while_an_outer_scope_cancels_the_connection_is_not_a_group() -> None:
    # Shutting a session down cancels its tasks while the peer closes the stream: the
    # reader's error and the cancellation arrive together (on trio, in one group). The
    # caller catches meshbus errors by type, so no exception group may leak out; the
    # cancellation wins where the backend reports it.
    escaped: BaseException | None = None
    with anyio.CancelScope() as outer:
        try:
            with unwrap_errors():
                async with anyio.create_task_group() as tg:

                    async def fail() -> None:
                        outer.cancel()
                        raise TransportError("connection closed by the peer")

                    tg.start_soon(fail)
                    await anyio.sleep_forever()
        except TransportError as exc:  # asyncio: the task group reports only the error
            escaped = exc
    assert outer.cancelled_caught or isinstance(escaped, TransportError)


async def test_a_bug_keeps_its_group() -> None:
    with pytest.raises(BaseExceptionGroup):
        await connection_failing_with(ProtocolError("bad frame"), KeyError("bug"))
