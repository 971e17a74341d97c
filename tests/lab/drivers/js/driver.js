#!/usr/bin/env node
'use strict'
/*
 * Lab client driver around kafkajs (the pinned version in package.json), following the
 * lab drivers spec: same arguments and JSON-lines events as every other driver.
 *
 * tests/lab/js_driver.py copies this file next to node_modules in .cache/drivers/js/ and
 * writes error_names.tsv (the project's "code TAB name" table) beside it, so error_name
 * uses the current protocol names (kafkajs still says NOT_LEADER_FOR_PARTITION for 6).
 *
 * kafkajs specifics: every send() is its own Produce request here (so each message gets
 * its own outcome and offset); the consumer always joins a group (kafkajs has no assign()),
 * so without --group it uses a throw-away group, never commits and reports group null.
 */
const fs = require('fs')
const path = require('path')

const USAGE_EXIT = 2

function fail(message) {
  process.stderr.write(`kwire-driver: ${message}\n`)
  process.exit(USAGE_EXIT)
}

function parseArgs(argv) {
  const a = {
    bootstrap: null, client_id: null, topic: null, produce: 0, rate: 0, size: 100, acks: 'all',
    partition: null, consume: false, group: null, expect: 0, idle_s: 5, duration_s: 60,
    props: {}, out: null, log: null,
  }
  const numbers = { '--produce': 'produce', '--rate': 'rate', '--size': 'size', '--partition': 'partition',
    '--expect': 'expect', '--idle-s': 'idle_s', '--duration-s': 'duration_s' }
  const strings = { '--bootstrap': 'bootstrap', '--client-id': 'client_id', '--topic': 'topic', '--acks': 'acks',
    '--group': 'group', '--out': 'out', '--log': 'log' }
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i]
    if (flag === '--consume') { a.consume = true; continue }
    if (i + 1 >= argv.length) fail(`missing value after ${flag}`)
    const v = argv[++i]
    if (flag in numbers) {
      const n = Number(v)
      if (v === '' || !Number.isFinite(n)) fail(`bad number for ${flag}: ${v}`)
      a[numbers[flag]] = n
    } else if (flag in strings) {
      a[strings[flag]] = v
    } else if (flag === '--prop') {
      const eq = v.indexOf('=')
      if (eq <= 0) fail(`--prop wants KEY=VALUE, got ${v}`)
      a.props[v.slice(0, eq)] = v.slice(eq + 1)
    } else {
      fail(`unknown argument ${flag}`)
    }
  }
  if (!a.bootstrap || !a.client_id || !a.topic || !a.out) fail('--bootstrap, --client-id, --topic and --out are required')
  if (!['0', '1', 'all', '-1'].includes(a.acks)) fail('--acks must be 0, 1 or all')
  if (a.produce < 0 || a.size < 0 || a.rate < 0 || a.duration_s <= 0) fail('--produce, --size, --rate must be >= 0 and --duration-s > 0')
  return a
}

/** Events: one JSON object per line, written synchronously; nothing after "end". */
class Events {
  constructor(file) {
    this.fd = fs.openSync(file, 'w')
    this.ended = false
  }

  emit(event, fields) {
    if (this.ended) return
    fs.writeSync(this.fd, JSON.stringify({ ts: Date.now() / 1000, event, ...fields }) + '\n')
    if (event === 'end') this.ended = true
  }
}

function loadErrorNames() {
  const names = new Map()
  try {
    for (const line of fs.readFileSync(path.join(__dirname, 'error_names.tsv'), 'utf8').split('\n')) {
      const [code, name] = line.split('\t')
      if (name && /^-?\d+$/.test(code)) names.set(Number(code), name.trim())
    }
  } catch (e) {
    // no table: kafkajs's own type names are used
  }
  return names
}

/** The Kafka protocol error inside a kafkajs error (retries-exceeded wraps it), or null. */
function protocolError(err, depth = 0) {
  if (!err || typeof err !== 'object' || depth > 5) return null
  if (typeof err.code === 'number' && typeof err.type === 'string') return err
  for (const inner of [err.cause, err.originalError, ...(Array.isArray(err.errors) ? err.errors : [])]) {
    const found = protocolError(inner, depth + 1)
    if (found) return found
  }
  return null
}

// --prop keys this driver maps onto kafkajs options; anything else is ignored and logged.
const CLIENT_PROPS = {
  'request.timeout.ms': (o, v) => { o.client.requestTimeout = Number(v); o.sendTimeout = Number(v) },
  'socket.connection.setup.timeout.ms': (o, v) => { o.client.connectionTimeout = Number(v) },
  'retries': (o, v) => { o.client.retry.retries = Number(v) },
  'retry.backoff.ms': (o, v) => { o.client.retry.initialRetryTime = Number(v) },
  'retry.backoff.max.ms': (o, v) => { o.client.retry.maxRetryTime = Number(v) },
  'metadata.max.age.ms': (o, v) => { o.producer.metadataMaxAge = Number(v); o.consumer.metadataMaxAge = Number(v) },
  'allow.auto.create.topics': (o, v) => {
    o.producer.allowAutoTopicCreation = v === 'true'
    o.consumer.allowAutoTopicCreation = v === 'true'
  },
  'enable.idempotence': (o, v) => { o.producer.idempotent = v === 'true' },
  'max.in.flight.requests.per.connection': (o, v) => { o.producer.maxInFlightRequests = Number(v) },
  'transaction.timeout.ms': (o, v) => { o.producer.transactionTimeout = Number(v) },
  'compression.type': (o, v) => { o.compression = v },
  'session.timeout.ms': (o, v) => { o.consumer.sessionTimeout = Number(v) },
  'heartbeat.interval.ms': (o, v) => { o.consumer.heartbeatInterval = Number(v) },
  'rebalance.timeout.ms': (o, v) => { o.consumer.rebalanceTimeout = Number(v) },
  'fetch.max.wait.ms': (o, v) => { o.consumer.maxWaitTimeInMs = Number(v) },
  'fetch.min.bytes': (o, v) => { o.consumer.minBytes = Number(v) },
  'fetch.max.bytes': (o, v) => { o.consumer.maxBytes = Number(v) },
  'max.partition.fetch.bytes': (o, v) => { o.consumer.maxBytesPerPartition = Number(v) },
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)))
}

/** Resolve with the promise's value, or with undefined after ms (never rejects). */
function bounded(promise, ms) {
  return Promise.race([promise.catch(() => undefined), sleep(ms)])
}

async function main() {
  const a = parseArgs(process.argv.slice(2))
  let logFd = null
  let events
  try {
    if (a.log) logFd = fs.openSync(a.log, 'w')
    events = new Events(a.out)
  } catch (e) {
    fail(`cannot open --out or --log: ${e.message}`)
  }
  const writeLog = (line) => {
    if (logFd !== null) fs.writeSync(logFd, line + '\n')
    else process.stderr.write(line + '\n')
  }

  const kafkajs = require('kafkajs')
  const { Kafka, logLevel, Partitioners, CompressionTypes } = kafkajs
  const version = require('kafkajs/package.json').version
  const errorNames = loadErrorNames()

  const startMs = Date.now()
  const totalMs = a.duration_s * 1000
  const graceMs = Math.min(3000, totalMs / 5)
  const softDeadline = startMs + totalMs - graceMs
  const hardDeadline = startMs + totalMs - Math.min(500, graceMs / 4)

  // One line per kafkajs log record: time, level, namespace, message, extra fields as JSON.
  const logCreator = () => ({ namespace, label, log }) => {
    const { message, timestamp, ...extra } = log
    const more = Object.keys(extra).length ? ' ' + JSON.stringify(extra) : ''
    writeLog(`${timestamp} ${label} [${namespace}] ${String(message).replace(/\n/g, ' | ')}${more}`)
  }

  const options = {
    client: { clientId: a.client_id, brokers: a.bootstrap.split(','), logLevel: logLevel.INFO, logCreator, retry: {} },
    producer: { createPartitioner: Partitioners.DefaultPartitioner },
    consumer: {},
    sendTimeout: undefined,
    compression: undefined,
  }
  const ignored = []
  for (const [key, value] of Object.entries(a.props)) {
    if (key in CLIENT_PROPS) {
      CLIENT_PROPS[key](options, value)
    } else {
      ignored.push(key)
      writeLog(`${new Date().toISOString()} WARN [kwire-driver] --prop ${key} ignored: kafkajs has no such knob`)
    }
  }
  const compressions = { gzip: CompressionTypes.GZIP, none: CompressionTypes.None }
  if (options.compression !== undefined && !(options.compression in compressions)) {
    ignored.push('compression.type')
    writeLog(`${new Date().toISOString()} WARN [kwire-driver] compression.type=${options.compression} ignored: kafkajs has only gzip built in`)
    options.compression = undefined
  }
  const acks = a.acks === 'all' ? -1 : Number(a.acks)
  const groupId = a.group || `${a.client_id}-nogroup-${process.pid}-${startMs}`

  const kafka = new Kafka(options.client)
  const retry = options.client.retry
  const config = {
    acks,
    retries: retry.retries === undefined ? 5 : retry.retries,
    'linger.ms': null, // kafkajs does not linger: each send() is a request
    'request.timeout.ms': options.client.requestTimeout === undefined ? 30000 : options.client.requestTimeout,
    'produce.timeout.ms': options.sendTimeout === undefined ? 30000 : options.sendTimeout,
    'enable.idempotence': options.producer.idempotent === true,
    'max.in.flight.requests.per.connection': options.producer.maxInFlightRequests === undefined ? null : options.producer.maxInFlightRequests,
    'retry.backoff.ms': retry.initialRetryTime === undefined ? 300 : retry.initialRetryTime,
    'compression.type': options.compression || 'none',
    partitioner: 'DefaultPartitioner (murmur2, Java-compatible)',
  }
  if (a.consume) {
    Object.assign(config, {
      'consumer.group.id': a.group,
      'consumer.throwaway.group.id': a.group ? null : groupId,
      'consumer.session.timeout.ms': options.consumer.sessionTimeout === undefined ? 30000 : options.consumer.sessionTimeout,
      'consumer.heartbeat.interval.ms': options.consumer.heartbeatInterval === undefined ? 3000 : options.consumer.heartbeatInterval,
      'consumer.fetch.max.wait.ms': options.consumer.maxWaitTimeInMs === undefined ? 5000 : options.consumer.maxWaitTimeInMs,
      'consumer.auto.commit': false,
    })
  }

  let sent = 0
  let acked = 0
  let failed = 0
  let consumed = 0
  let stopping = false
  const endEvent = () => events.emit('end', { sent, acked, failed, consumed, unresolved: Math.max(0, sent - acked - failed) })

  const producer = a.produce > 0 ? kafka.producer(options.producer) : null
  const consumer = a.consume ? kafka.consumer({ groupId, ...options.consumer }) : null

  events.emit('start', {
    library: 'kafkajs', library_version: version, client_id: a.client_id, args: a, config, ignored_props: ignored,
  })

  // Hard cap: whatever is still running, "end" is written and the process leaves.
  const hardTimer = setTimeout(() => {
    endEvent()
    process.stderr.write('kwire-driver: --duration-s reached, exiting\n')
    process.exit(0)
  }, Math.max(0, hardDeadline - Date.now()))

  const messageId = (seq) => `${a.client_id}:${seq}`
  const valueOf = (seq) => {
    const head = `${a.client_id}:${seq}:`
    return Buffer.from(head.length >= a.size ? head : head + 'x'.repeat(a.size - head.length))
  }

  const errorEvent = (seq, err) => {
    const perr = protocolError(err)
    const code = perr ? perr.code : null
    events.emit('error', {
      id: messageId(seq), seq, topic: a.topic, partition: a.partition,
      error: `${err && err.name ? err.name + ': ' : ''}${err && err.message ? err.message : String(err)}`,
      error_code: code, error_name: perr ? (errorNames.get(code) || perr.type) : null,
    })
  }

  async function produceAll() {
    try {
      await producer.connect()
    } catch (err) {
      writeLog(`${new Date().toISOString()} ERROR [kwire-driver] producer connect failed: ${err.message}`)
    }
    const t0 = Date.now()
    const inFlight = new Set()
    const window = 100 // sends outstanding at once when --rate is 0
    for (let seq = 0; seq < a.produce && !stopping; seq++) {
      if (a.rate > 0) {
        await sleep(Math.min(t0 + (seq * 1000) / a.rate, softDeadline) - Date.now())
        if (Date.now() >= softDeadline) break
      }
      while (inFlight.size >= window && !stopping) await Promise.race(inFlight)
      if (stopping) break
      const message = { key: String(seq), value: valueOf(seq) }
      if (a.partition !== null) message.partition = a.partition
      const record = { topic: a.topic, acks, messages: [message] }
      if (options.sendTimeout !== undefined) record.timeout = options.sendTimeout
      if (options.compression) record.compression = compressions[options.compression]
      events.emit('send', { id: messageId(seq), seq, topic: a.topic, partition: a.partition })
      sent++
      const p = producer.send(record).then(
        (metadata) => {
          acked++
          const md = (metadata && metadata[0]) || {}
          events.emit('ack', {
            id: messageId(seq), seq, topic: a.topic,
            partition: md.partition === undefined ? a.partition : md.partition,
            offset: md.baseOffset === undefined ? null : Number(md.baseOffset),
          })
        },
        (err) => {
          failed++
          errorEvent(seq, err)
        },
      )
      const tracked = p.finally(() => inFlight.delete(tracked))
      inFlight.add(tracked)
    }
    while (inFlight.size > 0 && Date.now() < softDeadline) {
      await Promise.race([...inFlight, sleep(softDeadline - Date.now())])
    }
  }

  async function consumeAll() {
    const seen = new Set()
    let lastNew = 0
    let assignedAt = 0
    consumer.on(consumer.events.GROUP_JOIN, () => {
      if (!assignedAt) assignedAt = Date.now()
    })
    await consumer.connect()
    await consumer.subscribe({ topics: [a.topic], fromBeginning: true })
    await consumer.run({
      autoCommit: false,
      eachBatch: async ({ batch }) => {
        let next = null
        for (const message of batch.messages) {
          const value = message.value ? message.value.toString('utf8') : ''
          const parts = value.split(':')
          const id = parts.length >= 3 ? `${parts[0]}:${parts[1]}` : value
          consumed++
          if (!seen.has(id)) {
            seen.add(id)
            lastNew = Date.now()
          }
          events.emit('consume', {
            id, topic: batch.topic, partition: batch.partition, offset: Number(message.offset), group: a.group,
          })
          next = Number(message.offset) + 1
        }
        if (a.group && next !== null) {
          let error = null
          try {
            await consumer.commitOffsets([{ topic: batch.topic, partition: batch.partition, offset: String(next) }])
          } catch (err) {
            error = `${err.name}: ${err.message}`
          }
          events.emit('commit', { group: a.group, offsets: { [String(batch.partition)]: next }, error })
        }
      },
    })
    // the idle clock starts once the group is joined (a join can take a while)
    while (!stopping) {
      if (a.expect > 0 && seen.size >= a.expect) break
      const idleFrom = Math.max(lastNew, assignedAt)
      if (idleFrom > 0 && Date.now() - idleFrom >= a.idle_s * 1000) break
      await sleep(Math.min(100, softDeadline - Date.now()))
      if (Date.now() >= softDeadline) break
    }
  }

  const tasks = []
  if (producer) tasks.push(produceAll())
  if (consumer) {
    tasks.push(consumeAll().catch((err) => {
      writeLog(`${new Date().toISOString()} ERROR [kwire-driver] consumer failed: ${err.name}: ${err.message}`)
      process.stderr.write(`kwire-driver: consumer failed: ${err.message}\n`)
    }))
  }
  await Promise.race([Promise.all(tasks), sleep(softDeadline - Date.now())])
  stopping = true
  endEvent()
  const left = () => Math.max(0, hardDeadline - Date.now())
  if (consumer) await bounded(consumer.disconnect(), Math.min(left(), 2000))
  if (producer) await bounded(producer.disconnect(), Math.min(left(), 2000))
  clearTimeout(hardTimer)
  process.exit(0)
}

main().catch((err) => {
  process.stderr.write(`kwire-driver: ${err && err.stack ? err.stack : err}\n`)
  process.exit(1)
})
