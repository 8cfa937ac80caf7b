// The E2B SDK's figures on our stack (issue 48, make bench): prints one JSON
// line on stdout, progress on stderr.
//
//   node test/e2b/bench.mjs
//
// Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, E2B_TEMPLATE (as
// for sdk.test.mjs; a pooled template gives the warm figures, one without a
// pool the cold ones), E2B_BENCH_ROUNDS (default 10), E2B_BENCH_RUNS
// (default 50), E2B_BENCH_UPLOADS (default 3).
//
// Figures, all in milliseconds unless named otherwise:
//   create_ms          Sandbox.create answered (N rounds, each a new sandbox)
//   first_run_ms       then its first commands.run('true') answered
//   create_to_run_ms   the two together: what a user waits for a sandbox
//   run_true_ms        commands.run('true') round trips at concurrency 1 on
//                      one sandbox (after warm-up), through the router
//   upload_mib_per_s   a 10 MiB files.write, MiB per second (median of 3)
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
    p99: round(percentile(values, 99)),
    min: round(Math.min(...values)),
    max: round(Math.max(...values)),
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

async function main() {
  const createMs = []
  const firstRunMs = []
  const totalMs = []
  for (let i = 0; i < rounds; i++) {
    const t0 = performance.now()
    const sbx = await create()
    const t1 = performance.now()
    await run(sbx, 'true')
    const t2 = performance.now()
    createMs.push(t1 - t0)
    firstRunMs.push(t2 - t1)
    totalMs.push(t2 - t0)
    log(`round ${i + 1}/${rounds}: create ${round(t1 - t0)} ms, first run ${round(t2 - t1)} ms`)
    // Killed before the next round, so each create finds what the last
    // left (a refilled pool, or none), not N sandboxes at once.
    await kill(sbx)
  }

  const sbx = await create()
  for (let i = 0; i < warmup; i++) await run(sbx, 'true')
  const runMs = []
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now()
    await run(sbx, 'true')
    runMs.push(performance.now() - t0)
  }
  log(`commands.run('true') x${runs}: p50 ${round(percentile(runMs, 50))} ms`)

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
    run_true_ms: summary(runMs),
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
  console.error(`bench: ${err.stack ?? err}`)
  code = 1
} finally {
  const failed = await tracker.killAll()
  if (failed.length > 0) code = 1
}
process.exit(code)
