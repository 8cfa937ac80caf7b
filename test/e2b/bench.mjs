// The E2B SDK's figures on our stack (issue 48, make bench): prints one JSON
// line on stdout, progress on stderr.
//
//   node test/e2b/bench.mjs
//
// Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, E2B_TEMPLATE (as
// for sdk.test.mjs; a pooled template gives the warm figures, one without a
// pool the cold ones), E2B_BENCH_ROUNDS (default 10), E2B_BENCH_RUNS
// (default 50), E2B_BENCH_UPLOADS (default 3); optional E2B_BENCH_HTTP_API,
// our HTTP API's base URL (the function's, without /e2b): each round then
// also creates a sandbox of the same template through it (POST
// /api/sandboxes?wait=20s, with E2B_API_KEY as its X-API-Key), the two
// sides alternating which goes first.
//
// Figures, all in milliseconds unless named otherwise:
//   create_ms          Sandbox.create answered (N rounds, each a new sandbox)
//   first_run_ms       then its first commands.run('true') answered
//   create_to_run_ms   the two together: what a user waits for a sandbox
//   first_run_failures each failed first commands.run (then retried every
//                      100 ms: the round's times include the retries)
//   http_create_ready_ms  (with E2B_BENCH_HTTP_API) our HTTP API's create
//                      → Ready of the same template, in the same rounds
//   run_true_ms        commands.run('true') round trips at concurrency 1 on
//                      one sandbox (after warm-up), through the router
//   exists_ms          files.exists('/tmp') round trips, alternating with
//                      the runs: one unary Connect call (filesystem.Stat)
//                      through the router, no process started, so the
//                      difference is what starting /bin/bash -l -c costs
//   upload_mib_per_s   a 10 MiB files.write, MiB per second (median of 3)
// Each *_ms figure is {n, p50, p99 (from 100 samples on), min, max, samples} (nearest rank).
// Every step has a time bound; every sandbox made is killed, on failure too,
// and the run's metadata is swept for any the client lost track of.
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'
import { Tracker, config, newRunId, percentile, withTimeout } from './lib.mjs'

const cfg = config()
const intEnv = (name, def) => {
  const v = process.env[name]
  if (v === undefined || v === '') return def
  const n = Number(v)
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name}=${v}: want a positive integer`)
  return n
}
const rounds = intEnv('E2B_BENCH_ROUNDS', 10)
const runs = intEnv('E2B_BENCH_RUNS', 50)
const uploads = intEnv('E2B_BENCH_UPLOADS', 3)
const httpApi = (process.env.E2B_BENCH_HTTP_API ?? '').replace(/\/+$/, '')
const warmup = 5
const createTimeoutMs = intEnv('E2B_CREATE_TIMEOUT_MS', 180_000)
const stepTimeoutMs = 60_000
const uploadBytes = 10 * 1024 * 1024

const runId = newRunId()
const metadata = { suite: 'e2b-bench', run: runId }
const tracker = new Tracker({ run: runId })
const log = (...args) => console.error('bench:', ...args)

function summary(values) {
  return {
    n: values.length,
    p50: round(percentile(values, 50)),
    // A p99 of fewer than 100 samples is their maximum: none is named.
    ...(values.length >= 100 && { p99: round(percentile(values, 99)) }),
    min: round(Math.min(...values)),
    max: round(Math.max(...values)),
    // Every sample, in the order taken: the Go benchmark prints its own
    // percentiles from them (a p99 of fewer than 100 is a maximum).
    samples: values.map(round),
  }
}
const round = (x) => Math.round(x * 10) / 10

async function create() {
  return tracker.track(
    await withTimeout(
      Sandbox.create(cfg.template, { timeoutMs: 10 * 60_000, metadata, requestTimeoutMs: createTimeoutMs }),
      createTimeoutMs + 5_000,
      'Sandbox.create',
    ),
  )
}

async function run(sbx, cmd) {
  return withTimeout(sbx.commands.run(cmd, { requestTimeoutMs: stepTimeoutMs, timeoutMs: stepTimeoutMs }), stepTimeoutMs + 5_000, `commands.run(${cmd})`)
}

async function kill(sbx) {
  await withTimeout(Sandbox.kill(sbx.sandboxId, { requestTimeoutMs: 30_000 }), 35_000, `kill ${sbx.sandboxId}`)
  tracker.ids.delete(sbx.sandboxId)
}

// httpApiCall is one request to our HTTP API with the same key, bounded.
async function httpApiCall(method, path, body) {
  const resp = await fetch(httpApi + path, {
    method,
    headers: { 'X-API-Key': cfg.apiKey, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  })
  const text = await resp.text()
  let json
  try {
    json = JSON.parse(text)
  } catch {
    json = undefined
  }
  return { status: resp.status, text, json }
}

// httpCreateReady creates a sandbox of the template through our HTTP API
// and returns once it answers Ready (the wait the API offers), then
// destroys it untimed. Its id is tracked, so a failure still kills it
// (the E2B API sees the same sandboxes).
async function httpCreateReady(id) {
  tracker.track(id)
  const t0 = performance.now()
  let r = await httpApiCall('POST', '/api/sandboxes?wait=20s', { sandbox_id: id, template: cfg.template })
  // A wait is at most 20 s (SANDBOX_MAX_READY_WAIT); a slower sandbox is
  // waited for again, up to the create bound, so its sample is its whole
  // time to Ready and the reason is in the log.
  while (r.status === 200 && r.json?.ready !== true && r.json?.wait_timed_out === true && performance.now() - t0 < createTimeoutMs) {
    log(`our HTTP API's create of ${id}: not Ready after ${round(performance.now() - t0)} ms: ${r.json?.reason}`)
    r = await httpApiCall('GET', `/api/sandboxes/${id}?wait=20s`)
  }
  const took = performance.now() - t0
  if (r.status !== 200 || r.json?.ready !== true) throw new Error(`our HTTP API's create of ${id}: ${r.status} ${r.text}`)
  const d = await httpApiCall('DELETE', `/api/sandboxes/${id}`)
  if (d.status !== 200) throw new Error(`our HTTP API's delete of ${id}: ${d.status} ${d.text}`)
  tracker.ids.delete(id)
  return took
}

const firstRunFailures = []

async function e2bCreateRun() {
  const t0 = performance.now()
  const sbx = await create()
  const t1 = performance.now()
  // A first run that fails is a finding, not the end of the run: it is
  // counted (first_run_failures) and retried every 100 ms for up to 30 s,
  // so the round's figure is what a user who retries waits.
  for (;;) {
    try {
      await run(sbx, 'true')
      break
    } catch (err) {
      firstRunFailures.push(`${round(performance.now() - t1)} ms after create: ${err.name}: ${err.message}`)
      log(`first commands.run on ${sbx.sandboxId} failed ${round(performance.now() - t1)} ms after its create: ${err.name}: ${err.message}`)
      if (performance.now() - t1 > 30_000) throw err
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
  const t2 = performance.now()
  // Killed before the next create, so each create finds what the last
  // left (a refilled pool, or none), not N sandboxes at once.
  await kill(sbx)
  return [t1 - t0, t2 - t1]
}

async function main() {
  const createMs = []
  const firstRunMs = []
  const totalMs = []
  const httpMs = []
  for (let i = 0; i < rounds; i++) {
    // The two sides alternate which goes first: what a create leaves the
    // node to do after its answer lands on whatever comes next.
    const e2bFirst = i % 2 === 0
    if (httpApi && !e2bFirst) httpMs.push(await httpCreateReady(`e2bb-${runId}-${i}`))
    const [c, r] = await e2bCreateRun()
    if (httpApi && e2bFirst) httpMs.push(await httpCreateReady(`e2bb-${runId}-${i}`))
    createMs.push(c)
    firstRunMs.push(r)
    totalMs.push(c + r)
    log(`round ${i + 1}/${rounds}: create ${round(c)} ms, first run ${round(r)} ms` + (httpApi ? `; our HTTP API's create → Ready ${round(httpMs.at(-1))} ms` : ''))
  }

  const sbx = await create()
  for (let i = 0; i < warmup; i++) {
    await run(sbx, 'true')
    await sbx.files.exists('/tmp', { requestTimeoutMs: stepTimeoutMs })
  }
  const runMs = []
  const existsMs = []
  for (let i = 0; i < runs; i++) {
    let t0 = performance.now()
    await run(sbx, 'true')
    runMs.push(performance.now() - t0)
    t0 = performance.now()
    const ok = await withTimeout(sbx.files.exists('/tmp', { requestTimeoutMs: stepTimeoutMs }), stepTimeoutMs + 5_000, 'files.exists(/tmp)')
    existsMs.push(performance.now() - t0)
    if (!ok) throw new Error('files.exists(/tmp) answered false')
  }
  log(`commands.run('true') x${runs}: p50 ${round(percentile(runMs, 50))} ms; files.exists: p50 ${round(percentile(existsMs, 50))} ms`)

  const data = new Blob([new Uint8Array(randomBytes(uploadBytes))])
  const mibPerS = []
  for (let i = 0; i < uploads; i++) {
    const t0 = performance.now()
    await withTimeout(sbx.files.write(`/tmp/e2b-bench-${runId}.bin`, data, { requestTimeoutMs: 120_000 }), 125_000, 'files.write of 10 MiB')
    const s = (performance.now() - t0) / 1000
    mibPerS.push(uploadBytes / (1024 * 1024) / s)
    log(`upload ${i + 1}/${uploads}: ${round(mibPerS.at(-1))} MiB/s`)
  }
  await kill(sbx)

  return {
    template: cfg.template,
    rounds,
    create_ms: summary(createMs),
    first_run_ms: summary(firstRunMs),
    create_to_run_ms: summary(totalMs),
    first_run_failures: firstRunFailures,
    ...(httpApi ? { http_create_ready_ms: summary(httpMs) } : {}),
    run_true_ms: summary(runMs),
    exists_ms: summary(existsMs),
    upload_mib_per_s: { n: mibPerS.length, median: round(percentile(mibPerS, 50)), samples: mibPerS.map(round) },
  }
}

// Ctrl-C or a SIGTERM from the Go test still kills what this run made.
let stopping = false
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, async () => {
    if (stopping) return
    stopping = true
    log(`${sig}: killing this run's sandboxes`)
    await tracker.killAll()
    process.exit(130)
  })
}

let code = 0
try {
  console.log(JSON.stringify(await main()))
} catch (err) {
  // undici's "fetch failed" says why only in its cause.
  console.error(`bench: ${err.stack ?? err}` + (err.cause ? `\ncause: ${err.cause.stack ?? err.cause}` : ''))
  code = 1
} finally {
  const failed = await tracker.killAll()
  if (failed.length > 0) code = 1
}
process.exit(code)
