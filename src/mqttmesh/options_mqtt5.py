"""The options of MQTT 5 and of shared subscriptions (``mqtt``): what an MQTT 5 client is told
at CONNACK and held to, and how a shared group picks its member. Data only, as options.py,
which puts them in ``OPTIONS``."""

from __future__ import annotations

from .option import Option

__all__ = ["MQTT5_OPTIONS"]

# what an MQTT 5 client is told at CONNACK, and held to
MQTT5_OPTIONS: list[Option] = [
    Option(
        "mqtt",
        "max_keepalive",
        int,
        0,
        "largest keep alive accepted, in seconds: an MQTT 5 client asking for more (or for none) "
        "is given this one as Server Keep Alive; a 3.1.1 client asking for more is refused "
        "(0x02); 0: no limit",
        0,
        65535,
    ),
    Option(
        "mqtt",
        "max_session_expiry",
        int,
        0,
        "longest Session Expiry Interval served, in seconds: an MQTT 5 client asking for more "
        "(or for a session that never expires) is given this one in CONNACK, and a 3.1.1 "
        "CleanSession=0 session ends this long after its client left; 0: no limit",
        0,
        4294967294,
    ),
    Option(
        "mqtt",
        "receive_maximum",
        int,
        1000,
        "QoS 1 and 2 messages an MQTT 5 client may have unacknowledged towards this node; a "
        "client with more QoS 2 messages awaiting PUBREL is disconnected (0x93)",
        1,
        65535,
    ),
    Option(
        "mqtt",
        "topic_alias_maximum",
        int,
        64,
        "topic aliases an MQTT 5 client may set on its connection to this node (0: none)",
        0,
        65535,
    ),
    Option(
        "mqtt",
        "response_information",
        str,
        "response/{client_id}/",
        "the Response Information an MQTT 5 client that asks for it (Request Response Information 1) "
        "gets in CONNACK: the start of the topics it may use for responses; {client_id} is replaced "
        "by its ClientId (the ACL still applies); empty: none is given",
    ),
    Option(
        "mqtt",
        "subscribe_denied_code",
        int,
        0x80,
        "the SUBACK reason code an MQTT 5 client gets for a filter the ACL denies: 128 "
        "(Unspecified error, which every client understands) or 135 (Not authorized)",
        choices=(0x80, 0x87),
    ),
    Option(
        "mqtt",
        "shared_subscriptions",
        bool,
        True,
        "take shared subscriptions ($share/{group}/{filter}) from MQTT 3.1.1 and 5 clients: "
        "each message of the filter goes to one member of each group, across the mesh; off: "
        "SUBACK 0x9E (MQTT 5; 3.1.1: 0x80), and CONNACK says Shared Subscription Available 0",
    ),
    Option(
        "mqtt",
        "shared_strategy",
        str,
        "local",
        "how a shared group picks the member of each message: local and round_robin rotate "
        "over its members (in a mesh: local serves on the publisher's node if it has a member, "
        "else the nearest; round_robin takes the nodes in turn, weighed by their connected "
        "members), hash_topic keeps one topic on one member and hash_clientid one publisher, "
        "sticky keeps one member until it goes (a connected member first, always)",
        choices=("local", "round_robin", "hash_topic", "hash_clientid", "sticky"),
    ),
]
