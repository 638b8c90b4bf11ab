"""Users, passwords and ACL profiles in a Message VPN.

Shows authentication "none" and "basic" (a password is checked off the event
loop, so those logins are awaited: ``await node.login(...)``), an ACL profile
whose exceptions use ``$client-username``, and how subscribe filters are judged
against the exceptions (overlap for a default of allow, cover for a default of deny).
Run it with ``python examples/acl_users.py``.
"""

from __future__ import annotations

import anyio

from meshbus import AccessDeniedError, AclProfile, AuthenticationError, ClientProfile, Node


async def main() -> None:
    async with Node() as node:
        # VPN "default" uses authentication "none": an unknown username logs in as "default".
        async with node.connect(username="visitor") as visitor:
            print(f"visitor logged in with the profiles of user {visitor.user.name!r}")

        vpn = node.create_vpn("tenant-a", authentication="basic")

        # Sensors may publish only under their own name and subscribe to nothing.
        vpn.add_acl_profile(
            AclProfile(
                "sensor",
                publish_default="deny",
                publish_exceptions=["sensors/$client-username/>"],
                subscribe_default="deny",
            )
        )
        # Operators may subscribe to anything except the audit trail.
        vpn.add_acl_profile(AclProfile("operator", subscribe_exceptions=["audit/>"]))
        # Dashboards may only subscribe inside sensors/.
        vpn.add_acl_profile(
            AclProfile("dashboard", subscribe_default="deny", subscribe_exceptions=["sensors/>"])
        )
        vpn.add_client_profile(ClientProfile("small-buffer", egress_max_messages=100))
        vpn.add_user("probe-7", password="probe-secret", acl_profile="sensor")
        vpn.add_user("ops", password="ops-secret", acl_profile="operator")
        vpn.add_user(
            "wall", password="wall-secret", acl_profile="dashboard", client_profile="small-buffer"
        )

        try:
            await node.login("tenant-a", username="ops", password="guess")
        except AuthenticationError as exc:
            print(f"refused: {exc}")  # the same answer for an unknown username

        async with (
            await node.login("tenant-a", username="probe-7", password="probe-secret") as probe,
            await node.login("tenant-a", username="ops", password="ops-secret") as ops,
            await node.login("tenant-a", username="wall", password="wall-secret") as wall,
        ):
            probe.publish("sensors/probe-7/temperature", b"21.5")
            print("probe-7 published to sensors/probe-7/temperature")
            try:
                probe.publish("sensors/probe-8/temperature", b"99")
            except AccessDeniedError as exc:
                print(f"denied: {exc}")

            # Default allow: a filter is denied when it could receive an exception topic.
            ops.subscribe("sensors/>")
            for text in (">", "audit/logins"):
                try:
                    ops.subscribe(text)
                except AccessDeniedError as exc:
                    print(f"denied: {exc}")

            # Default deny: a filter is allowed only when an exception covers all it matches.
            wall.subscribe("sensors/*/temperature")
            try:
                wall.subscribe("*/probe-7/temperature")
            except AccessDeniedError as exc:
                print(f"denied: {exc}")

            probe.publish("sensors/probe-7/temperature", b"21.7")
            for name, session in (("ops", ops), ("wall", wall)):
                message = session.receive_nowait()
                assert message is not None
                print(f"{name} received {message.topic} = {message.payload.decode()}")
            print(f"denied operations in tenant-a: {vpn.statistics().denied}")


if __name__ == "__main__":
    anyio.run(main)
