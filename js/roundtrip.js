// MQTT.js against mqttmesh (tests/integration/test_mqttjs.py): a subscriber on one URL, a
// publisher on another (ws://, wss:// or mqtt://), N messages at a QoS. Once subscribed it
// prints {"subscribed": [...granted]} and waits for a line on stdin (the caller sees the
// subscription reach the publisher's node), then publishes; prints what arrived as one JSON
// line and exits (a deadline bounds every run).
//   node roundtrip.js '{"sub": "ws://127.0.0.1:8080/mqtt", "pub": "mqtt://127.0.0.1:1884",
//                       "topic": "js/t", "count": 20, "qos": 1, "deadline_ms": 10000}
// With "version": 5 both clients speak MQTT 5; "properties" (MQTT.js names: userProperties,
// contentType, responseTopic, correlationData as a string) go with every publish, and
// each message received reports its properties; "sub_properties" are the subscriber's
// CONNECT properties (topicAliasMaximum: MQTT.js then resolves the aliases the node sets).'
"use strict";
const mqtt = require("mqtt");

const cfg = JSON.parse(process.argv[2]);
const options = { protocolVersion: cfg.version || 4, reconnectPeriod: 0, connectTimeout: 5000 };
if (cfg.ca) options.ca = require("fs").readFileSync(cfg.ca);
const got = [];
const result = { connected: [], suback: null, received: got, error: null };

function finish(code) {
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(code);
}
setTimeout(() => { result.error = "deadline"; finish(2); }, cfg.deadline_ms || 10000);

const subOptions = { ...options, clientId: "js-sub-" + process.pid, clean: true };
if (cfg.sub_properties) subOptions.properties = cfg.sub_properties; // (MQTT 5 CONNECT properties)
const sub = mqtt.connect(cfg.sub, subOptions);
sub.on("error", (e) => { result.error = "sub: " + e.message; finish(3); });
sub.on("message", (topic, payload, packet) => {
  const item = { topic, payload: payload.toString(), qos: packet.qos };
  if (packet.properties) {
    const p = { ...packet.properties };
    if (p.correlationData) p.correlationData = p.correlationData.toString();
    item.properties = p;
  }
  got.push(item);
  if (got.length === cfg.count) {
    sub.end(false, () => finish(0));
  }
});
sub.on("connect", () => {
  result.connected.push("sub");
  sub.subscribe(cfg.topic + "/#", { qos: cfg.qos }, (err, granted) => {
    if (err) { result.error = "subscribe: " + err.message; finish(4); }
    result.suback = granted.map((g) => g.qos);
    process.stdout.write(JSON.stringify({ subscribed: result.suback }) + "\n");
    process.stdin.once("data", () => publish());
  });
});

function publish() {
  const pub = mqtt.connect(cfg.pub, { ...options, clientId: "js-pub-" + process.pid });
  pub.on("error", (e) => { result.error = "pub: " + e.message; finish(5); });
  pub.on("connect", async () => {
    result.connected.push("pub");
    for (let i = 0; i < cfg.count; i++) {
      const opts = { qos: cfg.qos };
      if (cfg.properties) {
        opts.properties = { ...cfg.properties };
        if (opts.properties.correlationData) opts.properties.correlationData = Buffer.from(opts.properties.correlationData);
      }
      await pub.publishAsync(cfg.topic + "/x", String(i), opts);
    }
    pub.end();
  });
}
