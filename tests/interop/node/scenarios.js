// One scenario of a third-party Node.js RocketMQ client against tidemq, run by
// tests/interop/test_node_clients.py in its own process.
//
//   node scenarios.js <client> <role> --namesrv ADDR --topic T [--group G] [--count N]
//        [--expect N] [--expression E] [--fail-first] --out FILE --timeout-s S
//        [--deferred-ack] [--thread-count N] [--max-batch-size N]   (cpp2 consume only)
//
// client: "ons"  = ali-ons 3.12.0 (pure JavaScript implementation of the 4.x protocol)
//         "cpp2" = rocketmq-nodejs 1.1.2 (native addon around the Apache C++ client 2.x core)
// role:   "produce" sends msg-0 .. msg-(N-1), tags TagA / TagB alternating, key key-i;
//         "half" (ali-ons only) sends msg-0 .. msg-(N-1) as transactional half messages: the
//         client marks a message with property TRAN_MSG=true as a prepared send (sysflag);
//         it has no END_TRANSACTION of its own, the test ends the halves;
//         "consume" push-consumes until --expect messages arrived (each delivery recorded,
//         with its attempt number per body and ms since start, and printed as "delivered
//         <body> attempt <n>"); with --fail-first the first delivery of every message fails,
//         so the client hands it back and it must come again from the group's retry topic.
//         --deferred-ack acks from setImmediate, not in the listener; --thread-count and
//         --max-batch-size set the addon's options of those names (tests/interop/node/
//         retry_soak.py compares them).
// The result document (JSON, written whole: to a temporary name, then renamed) goes to --out
// with "ok" true when the scenario completed (else "error" says why); "CONSUMER STARTED" on
// stdout says the consumer is subscribed. Exit 0 when the scenario completed, 1 otherwise;
// the process ends itself at --timeout-s. The C++ 2.x core sometimes hangs in its exit
// handlers after a clean shutdown, so the test runner stops a process that wrote its
// document and did not exit soon after.
'use strict';

const fs = require('fs');
const path = require('path');

function parseArgs(argv) {
  const [client, role, ...rest] = argv;
  const options = { client, role, count: 0, expect: 0, expression: '*', failFirst: false };
  for (let i = 0; i < rest.length; i++) {
    const name = rest[i];
    if (name === '--fail-first') {
      options.failFirst = true;
      continue;
    }
    if (name === '--deferred-ack') {
      options.deferredAck = true;
      continue;
    }
    const value = rest[++i];
    const key = name.replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    options[key] = ['count', 'expect', 'timeoutS', 'threadCount', 'maxBatchSize'].includes(key) ? Number(value) : value;
  }
  for (const required of ['namesrv', 'topic', 'out', 'timeoutS']) {
    if (options[required] === undefined) throw new Error(`missing --${required}`);
  }
  return options;
}

const options = parseArgs(process.argv.slice(2));
const startedAt = Date.now();
const result = { client: options.client, role: options.role, sends: [], received: [] };

function finish(ok, error) {
  result.ok = ok;
  if (error) result.error = String(error && error.stack ? error.stack : error);
  fs.writeFileSync(`${options.out}.tmp`, JSON.stringify(result));
  fs.renameSync(`${options.out}.tmp`, options.out);
  process.exit(ok ? 0 : 1);
}

setTimeout(() => finish(false, `timed out after ${options.timeoutS} s`),
  options.timeoutS * 1000).unref();

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function waitForExpected() {
  while (result.received.length < options.expect) await sleep(50);
}

function deliveries() {
  // Delivery count per body, to fail only the first delivery of each message.
  const seen = new Map();
  return body => {
    const count = (seen.get(body) || 0) + 1;
    seen.set(body, count);
    return count;
  };
}

// -- ali-ons ---------------------------------------------------------------------------------

// ali-ons asks for an HTTP client to look name servers up; with nameSrv given it is never used.
const noHttp = { request: async () => { throw new Error('no HTTP name-server lookup here'); } };
// --access-key / --secret-key: sign every request (RocketMQ ACL), as each client offers it.
const onsCredentials = options.accessKey
  ? { accessKey: options.accessKey, secretKey: options.secretKey } : {};
function cpp2Credentials(client) {
  if (options.accessKey) client.setSessionCredentials(options.accessKey, options.secretKey, 'LOCAL');
}

async function onsProduce() {
  const { Producer, Message } = require('ali-ons');
  const producer = new Producer({ producerGroup: options.group || 'ons_producer',
    nameSrv: options.namesrv, httpclient: noHttp, ...onsCredentials });
  await producer.ready();
  for (let i = 0; i < options.count; i++) {
    const message = new Message(options.topic, i % 2 === 0 ? 'TagA' : 'TagB',
      Buffer.from(`msg-${i}`));
    message.keys = [`key-${i}`];
    const sent = await producer.send(message);
    result.sends.push({ index: i, status: sent.sendStatus, msg_id: sent.msgId,
      queue_id: sent.messageQueue.queueId, offset: sent.queueOffset });
  }
  await producer.close();
}

async function onsHalf() {
  const { Producer, Message } = require('ali-ons');
  const producer = new Producer({ producerGroup: options.group || 'ons_tx_producer',
    nameSrv: options.namesrv, httpclient: noHttp });
  await producer.ready();
  for (let i = 0; i < options.count; i++) {
    const message = new Message(options.topic, 'TagTx', Buffer.from(`msg-${i}`));
    message.keys = [`key-${i}`];
    message.properties.TRAN_MSG = 'true';
    message.properties.PGROUP = options.group || 'ons_tx_producer';
    const sent = await producer.send(message);
    result.sends.push({ index: i, status: sent.sendStatus, msg_id: sent.msgId,
      queue_id: sent.messageQueue.queueId, offset: sent.queueOffset });
  }
  await producer.close();
}

async function onsConsume() {
  const { Consumer } = require('ali-ons');
  const consumer = new Consumer({ consumerGroup: options.group, nameSrv: options.namesrv,
    httpclient: noHttp, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET', maxReconsumeTimes: 3,
    ...onsCredentials });
  consumer.on('error', () => {}); // transient route errors before the retry topic exists
  const delivery = deliveries();
  consumer.subscribe(options.topic, options.expression, async msg => {
    const body = msg.body.toString();
    const attempt = delivery(body);
    result.received.push({ body, tags: msg.tags, keys: msg.keys || '',
      topic: msg.retryTopic || msg.topic, msg_id: msg.msgId,
      reconsume_times: msg.reconsumeTimes, attempt, at_ms: Date.now() - startedAt });
    console.log(`delivered ${body} attempt ${attempt}`);
    if (options.failFirst && attempt === 1) throw new Error(`first delivery of ${body} fails`);
  });
  await consumer.ready();
  console.log('CONSUMER STARTED');
  await waitForExpected();
  await consumer.close();
}

// -- rocketmq-nodejs (C++ client 2.x core) ---------------------------------------------------

function cppLogDir() {
  return path.join(path.dirname(options.out), 'cpp2-logs');
}

async function cpp2Produce() {
  const { Producer } = require('rocketmq-nodejs');
  const producer = new Producer(options.group || 'cpp2_producer',
    { nameServer: options.namesrv, logDir: cppLogDir() });
  cpp2Credentials(producer);
  await producer.start();
  for (let i = 0; i < options.count; i++) {
    const sent = await producer.send(options.topic, `msg-${i}`,
      { tags: i % 2 === 0 ? 'TagA' : 'TagB', keys: `key-${i}` });
    result.sends.push({ index: i, status: sent.status, msg_id: sent.msgId, offset: sent.offset });
  }
  await producer.shutdown();
}

// How rocketmq-nodejs 1.1.2 consumes (read from its Release/*.node, N-API, and the C++ 2.x
// core's ConsumeMessageConcurrentlyService): the core hands the listener a whole pull result
// (up to 32 messages of one queue; the addon's maxBatchSize option sets a size the core's
// concurrent service never reads) in one consumeMessage call. The addon emits the messages
// one by one, each after the previous one's ack.done(), and stops at the first
// ack.done(false) (or 30 s without an ack): the call answers RECONSUME_LATER, and the core
// sends back EVERY message of the batch: those the listener acked before, and those it never
// saw. A --fail-first run is exact only while a failing first delivery is alone in its
// batch, so the test produces one message at a time (test_node_clients.py). The listener
// acks at once: the addon has no libuv handles of its own (it calls JS through a
// thread-safe function and waits on a std::promise), so there is no race for a later loop
// turn to avoid, and acking later does not change what the core does with a batch.
async function cpp2Consume() {
  const { PushConsumer } = require('rocketmq-nodejs');
  const consumer = new PushConsumer(options.group,
    { nameServer: options.namesrv, logDir: cppLogDir(), maxReconsumeTimes: 3,
      ...(options.threadCount ? { threadCount: options.threadCount } : {}),
      ...(options.maxBatchSize ? { maxBatchSize: options.maxBatchSize } : {}) });
  cpp2Credentials(consumer);
  consumer.subscribe(options.topic, options.expression);
  const delivery = deliveries();
  consumer.on('message', (msg, ack) => {
    const attempt = delivery(msg.body);
    result.received.push({ body: msg.body, tags: msg.tags, keys: msg.keys,
      topic: msg.topic, msg_id: msg.msgId, attempt, at_ms: Date.now() - startedAt });
    console.log(`delivered ${msg.body} attempt ${attempt}`);
    const ok = !(options.failFirst && attempt === 1);
    if (options.deferredAck) setImmediate(() => ack.done(ok));
    else ack.done(ok);
  });
  await consumer.start();
  console.log('CONSUMER STARTED');
  await waitForExpected();
  await consumer.shutdown();
}

const scenarios = {
  ons: { produce: onsProduce, consume: onsConsume, half: onsHalf },
  cpp2: { produce: cpp2Produce, consume: cpp2Consume },
};

const scenario = (scenarios[options.client] || {})[options.role];
if (!scenario) {
  finish(false, `unknown client/role ${options.client}/${options.role}`);
} else {
  scenario().then(() => finish(true), error => finish(false, error));
}
