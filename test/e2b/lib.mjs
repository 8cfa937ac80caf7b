// Shared by sdk.test.mjs and bench.mjs: the environment they are driven by,
// time bounds, and the bookkeeping that kills every sandbox they made.
//
// The SDK itself reads E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY from the
// environment, as it would for any E2B user; this file only checks they are
// there, so a run without them fails saying which, instead of reaching for
// E2B's cloud (the SDK's default) or timing out.
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'

// config reads the environment once. required lists what the caller cannot
// run without; E2B_DEBUG must be unset (the SDK would talk to localhost:49983
// and skip the control plane).
export function config({ required = ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'E2B_TEMPLATE'] } = {}) {
  const missing = required.filter((name) => !process.env[name])
  if (missing.length > 0) {
    throw new Error(`set ${missing.join(', ')} (see test/e2b/README.md): the E2B SDK tests run against our control plane and router, never E2B's cloud`)
  }
  if ((process.env.E2B_DEBUG ?? '') !== '') {
    throw new Error('E2B_DEBUG must be unset: with it the SDK skips the control plane and dials envd on localhost')
  }
  return {
    apiUrl: process.env.E2B_API_URL,
    sandboxUrl: process.env.E2B_SANDBOX_URL.replace(/\/+$/, ''),
    apiKey: process.env.E2B_API_KEY,
    otherApiKey: process.env.E2B_OTHER_API_KEY || undefined,
    template: process.env.E2B_TEMPLATE,
    pauseTemplate: process.env.E2B_PAUSE_TEMPLATE || undefined,
    // Where a file must live to outlive a pause: pause scales the sandbox
    // to no Pod, so only a volume that is not the Pod's own keeps it.
    pauseDir: (process.env.E2B_PAUSE_DIR || '/mnt/user-data').replace(/\/+$/, ''),
  }
}

// runId names one run: its sandboxes carry it as metadata, so the sweep in
// Tracker.killAll finds even one whose create answered after the client
// had given up on it.
export function newRunId() {
  return `${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`
}

// withTimeout rejects after ms with an error naming what took too long. The
// SDK calls it wraps also carry requestTimeoutMs, which aborts their fetch;
// this is the bound on everything else (iterating a paginator, a stream).
export async function withTimeout(promise, ms, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms)
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}

// listAll walks every page of Sandbox.list (a paginator since SDK 2.x),
// at most maxPages, each page bounded by requestTimeoutMs.
export async function listAll(opts = {}, { maxPages = 50, requestTimeoutMs = 30_000 } = {}) {
  const paginator = Sandbox.list({ ...opts, requestTimeoutMs })
  const items = []
  for (let page = 0; paginator.hasNext; page++) {
    if (page >= maxPages) throw new Error(`Sandbox.list: more than ${maxPages} pages`)
    items.push(...(await paginator.nextItems()))
  }
  return items
}

// Tracker remembers every sandbox a run made (by id) and kills them all,
// then sweeps the control plane for any other sandbox carrying the run's
// metadata.
export class Tracker {
  constructor(metadata) {
    this.metadata = metadata
    this.ids = new Set()
  }

  track(sandboxOrId) {
    const id = typeof sandboxOrId === 'string' ? sandboxOrId : sandboxOrId.sandboxId
    this.ids.add(id)
    return sandboxOrId
  }

  // killAll never throws: it runs in after hooks and finally blocks, where
  // an error would hide the test's own. What it could not kill it returns
  // (and prints), so a leak is visible in the log.
  async killAll({ requestTimeoutMs = 30_000 } = {}) {
    const failed = []
    for (const id of this.ids) {
      try {
        await withTimeout(Sandbox.kill(id, { requestTimeoutMs }), requestTimeoutMs + 5_000, `kill ${id}`)
        this.ids.delete(id)
      } catch (err) {
        failed.push(`${id}: ${err.message}`)
      }
    }
    try {
      const left = await withTimeout(listAll({ query: { metadata: this.metadata } }), 60_000, 'Sandbox.list for the sweep')
      for (const info of left) {
        try {
          await withTimeout(Sandbox.kill(info.sandboxId, { requestTimeoutMs }), requestTimeoutMs + 5_000, `kill ${info.sandboxId}`)
        } catch (err) {
          failed.push(`${info.sandboxId} (found by metadata): ${err.message}`)
        }
      }
    } catch (err) {
      failed.push(`sweep by metadata ${JSON.stringify(this.metadata)}: ${err.message}`)
    }
    if (failed.length > 0) console.error(`could not kill: ${failed.join('; ')}`)
    return failed
  }
}

export function sha256(bytes) {
  return createHash('sha256').update(bytes).digest('hex')
}

// percentile is the nearest-rank percentile (p in 0..100) of numbers.
export function percentile(values, p) {
  if (values.length === 0) return undefined
  const sorted = [...values].sort((a, b) => a - b)
  const rank = Math.ceil((p / 100) * sorted.length)
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}
