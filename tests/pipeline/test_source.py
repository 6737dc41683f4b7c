"""The live source: ``spark.readStream.format("mqttmesh")`` subscribed to a running node."""

from __future__ import annotations

import pytest

from mqttmesh.pipeline.source import register
from support.mesh import publish
from support.processes import wait_for

pytestmark = [pytest.mark.process, pytest.mark.spark]


def test_the_live_source_streams_what_the_node_delivers(spark, broker):
    register(spark)
    df = (
        spark.readStream.format("mqttmesh")
        .option("port", str(broker.port))
        .option("filter", "live/#")
        .option("qos", "1")
        .load()
    )
    query = df.writeStream.format("memory").queryName("live_rows").trigger(processingTime="0.5 seconds").start()
    try:

        def rows(where="true"):
            return spark.sql(f"select * from live_rows where {where}").collect()

        # the subscription is in place once a probe makes it through
        wait_for(
            lambda: publish(broker, "live/probe", [b"p"], qos=1) or rows("topic = 'live/probe'"),
            60,
            interval=0.5,
            what="a probe message through the live source",
        )
        publish(broker, "live/data", [b"%d" % i for i in range(20)], qos=1, client_id="pub")
        publish(broker, "other/topic", [b"not subscribed"], qos=1)
        got = wait_for(
            lambda: len(rows("topic = 'live/data'")) == 20 and rows("topic = 'live/data'"),
            30,
            interval=0.2,
            what="the 20 data messages",
        )
        assert sorted(int(r.payload) for r in got) == list(range(20))  # each once
        assert {(r.qos, r.retain, r.payload_size) for r in got} == {(1, False, len(r.payload)) for r in got}
        assert rows("topic = 'other/topic'") == []
        assert all(r.timestamp is not None for r in got)
    finally:
        query.stop()
