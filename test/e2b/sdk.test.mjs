// The unmodified e2b SDK (test/e2b/package.json pins it) driving our
// sandboxes through our control plane (E2B_API_URL) and router
// (E2B_SANDBOX_URL). Every assertion is what E2B's SDK documents or what its
// code does with E2B's answers (node_modules/e2b/dist/index.js is the judge):
// a test here fails when our stack answers in a way the SDK reads
// differently from E2B's.
//
//   node --test test/e2b/sdk.test.mjs
//
// Environment (README.md): E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY,
// E2B_OTHER_API_KEY (another principal's key), E2B_TEMPLATE; optional
// E2B_PAUSE_TEMPLATE (a template whose sandboxes can pause) and
// E2B_PAUSE_DIR (a directory on a volume that outlives the Pod, default
// /mnt/user-data); E2B_DEBUG unset. Every test has a timeout and every
// SDK call a request timeout; every sandbox made is killed in after hooks,
// then the run's metadata is swept for any the client lost track of.
import { after, before, describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import {
  CommandExitError,
  FileNotFoundError,
  NotFoundError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
} from 'e2b'
import { Tracker, config, listAll, newRunId, sha256, sleep, withTimeout } from './lib.mjs'

const cfg = config({ required: ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'E2B_OTHER_API_KEY', 'E2B_TEMPLATE'] })
const runId = newRunId()
const metadata = { suite: 'e2b-sdk-test', run: runId }
const createEnv = { E2B_TEST_CREATE_ENV: 'from-create' }
// Long enough for the whole file; setTimeout's test moves it both ways.
const sandboxTimeoutMs = 15 * 60_000
// A create may cold-start a Pod under gVisor: more than the SDK's 60 s.
const createRequestTimeoutMs = Number(process.env.E2B_CREATE_TIMEOUT_MS || 180_000)
const createTestTimeoutMs = createRequestTimeoutMs + 30_000
const envdPort = '49983'
// How far apart our clock and the control plane's may read (same machine)
// plus the time between the call and our reading of the clock.
const clockSlackMs = 60_000
const workDir = `/tmp/e2b-sdk-${runId}`

const tracker = new Tracker({ run: runId })

async function create(template = cfg.template, extra = {}) {
  return tracker.track(
    await Sandbox.create(template, {
      timeoutMs: sandboxTimeoutMs,
      metadata,
      envs: createEnv,
      requestTimeoutMs: createRequestTimeoutMs,
      ...extra,
    }),
  )
}

// The suite's main sandbox, and a second one made on first use (the kill
// test ends it; the token tests use it as "another sandbox").
let sbx
let secondPromise
function second() {
  secondPromise ??= create()
  return secondPromise
}

// rawFetch calls the router as a client other than the SDK would: the
// sandbox and port named in E2B's headers, the token only if given.
function rawFetch(path, { sandboxId, token, method = 'GET', body, contentType } = {}) {
  const headers = { 'E2b-Sandbox-Id': sandboxId, 'E2b-Sandbox-Port': envdPort }
  if (token !== undefined) headers['X-Access-Token'] = token
  if (contentType) headers['Content-Type'] = contentType
  return fetch(`${cfg.sandboxUrl}${path}`, { method, headers, body, signal: AbortSignal.timeout(30_000) })
}

// rejectsWith asserts the promise rejects with an instance of cls, and
// returns the error for further checks (its message names what came back).
async function rejectsWith(promise, cls, what) {
  let err
  await assert.rejects(promise, (e) => {
    err = e
    assert.ok(e instanceof cls, `${what}: want ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
  return err
}

describe('the e2b SDK drives our sandboxes', { concurrency: false }, () => {
  before(async () => {
    sbx = await create()
  }, { timeout: createTestTimeoutMs })

  after(async () => {
    // Bounded: a kill per sandbox, each with its own request timeout.
    const failed = await tracker.killAll()
    assert.deepEqual(failed, [], 'every sandbox this run made is killed')
  }, { timeout: 180_000 })

  it('creates a sandbox with its timeout, metadata and env', { timeout: 60_000 }, async () => {
    assert.match(sbx.sandboxId, /\S/)
    // Every sandbox is secure: the create answer carries its envd token.
    assert.equal(typeof sbx.envdAccessToken, 'string', 'the create answer carries envdAccessToken')
    assert.notEqual(sbx.envdAccessToken, '')
    const info = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.state, 'running')
    assert.ok(info.templateId === cfg.template || info.name === cfg.template,
      `templateId ${info.templateId} or name ${info.name} is the template ${cfg.template}`)
    for (const [k, v] of Object.entries(metadata)) assert.equal(info.metadata[k], v, `metadata ${k}`)
    const lifetime = info.endAt.getTime() - info.startedAt.getTime()
    assert.ok(Math.abs(lifetime - sandboxTimeoutMs) < clockSlackMs,
      `endAt - startedAt = ${lifetime} ms, the create asked for ${sandboxTimeoutMs} ms`)
    assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)
    assert.equal(await sbx.isRunning({ requestTimeoutMs: 15_000 }), true)
    const r = await sbx.commands.run('echo "$E2B_TEST_CREATE_ENV"')
    assert.equal(r.stdout, 'from-create\n', 'the create envs reach commands')
  })

  describe('commands', () => {
    it('run: stdout, stderr and exit code 0', { timeout: 60_000 }, async () => {
      const r = await sbx.commands.run('echo out; echo err >&2')
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'out\n')
      assert.equal(r.stderr, 'err\n')
    })

    it('run: a non-zero exit throws CommandExitError', { timeout: 60_000 }, async () => {
      const err = await rejectsWith(sbx.commands.run('echo partial; echo oops >&2; exit 3'), CommandExitError, 'exit 3')
      assert.equal(err.exitCode, 3)
      assert.equal(err.stdout, 'partial\n')
      assert.equal(err.stderr, 'oops\n')
    })

    it('run: envs per command, over the create envs', { timeout: 60_000 }, async () => {
      const r = await sbx.commands.run('echo "$ONE|$E2B_TEST_CREATE_ENV"', {
        envs: { ONE: 'first value', E2B_TEST_CREATE_ENV: 'overridden' },
      })
      assert.equal(r.stdout, 'first value|overridden\n')
    })

    it('run: cwd', { timeout: 60_000 }, async () => {
      assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
      assert.equal((await sbx.commands.run('pwd', { cwd: '/' })).stdout, '/\n')
    })

    it('run: output streams as it is written, not at the end', { timeout: 60_000 }, async () => {
      const chunks = []
      const r = await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.5; done', {
        onStdout: (data) => chunks.push({ data, at: Date.now() }),
      })
      assert.equal(r.stdout, '1\n2\n3\n')
      assert.equal(chunks.map((c) => c.data).join(''), '1\n2\n3\n')
      // Written a second apart from first to last: a router or agent that
      // holds the response back delivers them together at the end.
      const span = chunks.at(-1).at - chunks[0].at
      assert.ok(span >= 600, `stdout's first and last chunks came ${span} ms apart, written 1000 ms apart`)
    })

    it('run: a megabyte of output arrives whole', { timeout: 60_000 }, async () => {
      const r = await sbx.commands.run("head -c 1048576 /dev/zero | tr '\\0' a")
      assert.equal(r.stdout.length, 1048576)
      assert.match(r.stdout, /^a+$/)
    })

    it('a background process: listed, then killed by its handle', { timeout: 60_000 }, async () => {
      const handle = await sbx.commands.run('sleep 600', { background: true })
      try {
        assert.ok(Number.isInteger(handle.pid) && handle.pid > 0, `pid ${handle.pid}`)
        assert.equal(handle.exitCode, undefined, 'still running')
        const listed = (await sbx.commands.list()).find((p) => p.pid === handle.pid)
        assert.ok(listed, `commands.list() shows pid ${handle.pid}`)
        assert.ok(listed.args.some((a) => a.includes('sleep 600')), `its args ${JSON.stringify(listed.args)}`)
        assert.equal(await handle.kill(), true)
        const err = await rejectsWith(withTimeout(handle.wait(), 20_000, 'wait after kill'), CommandExitError, 'a killed process')
        assert.notEqual(err.exitCode, 0)
        assert.equal((await sbx.commands.list()).some((p) => p.pid === handle.pid), false, 'gone from commands.list()')
      } finally {
        await sbx.commands.kill(handle.pid).catch(() => {})
      }
    })

    it('a background process killed by commands.kill(pid)', { timeout: 60_000 }, async () => {
      const handle = await sbx.commands.run('sleep 600', { background: true })
      try {
        assert.equal(await sbx.commands.kill(handle.pid), true)
        await rejectsWith(withTimeout(handle.wait(), 20_000, 'wait after kill'), CommandExitError, 'a killed process')
        // SDK: false when the process is not found (Connect NotFound).
        assert.equal(await sbx.commands.kill(handle.pid), false)
      } finally {
        await sbx.commands.kill(handle.pid).catch(() => {})
      }
    })

    it('a background process run to its end by wait()', { timeout: 60_000 }, async () => {
      const handle = await sbx.commands.run('sleep 1; echo done', { background: true })
      const r = await withTimeout(handle.wait(), 30_000, 'wait')
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'done\n')
    })

    it('run with timeoutMs: a command past it ends in TimeoutError', { timeout: 60_000 }, async () => {
      const start = Date.now()
      await rejectsWith(sbx.commands.run('sleep 30', { timeoutMs: 2_000 }), TimeoutError, 'sleep 30 with timeoutMs 2000')
      const took = Date.now() - start
      assert.ok(took < 20_000, `the timeout took ${took} ms`)
      // The sandbox still answers after a cut stream.
      assert.equal((await sbx.commands.run('echo still here')).stdout, 'still here\n')
    })
  })

  describe('files', () => {
    it('makeDir, write, read, exists, getInfo, list, rename, remove', { timeout: 90_000 }, async () => {
      assert.equal(await sbx.files.makeDir(workDir), true, 'makeDir of a new directory')
      assert.equal(await sbx.files.makeDir(workDir), false, 'makeDir of an existing one')
      const dirInfo = await sbx.files.getInfo(workDir)
      assert.equal(dirInfo.type, 'dir')

      const a = `${workDir}/a.txt`
      const written = await sbx.files.write(a, 'hello e2b\n')
      assert.equal(written.name, 'a.txt')
      assert.equal(written.path, a)
      assert.equal(written.type, 'file')
      assert.equal(await sbx.files.read(a), 'hello e2b\n')
      assert.equal(await sbx.files.exists(a), true)
      assert.equal(await sbx.files.exists(`${workDir}/missing.txt`), false)

      const info = await sbx.files.getInfo(a)
      assert.equal(info.name, 'a.txt')
      assert.equal(info.path, a)
      assert.equal(info.type, 'file')
      assert.equal(info.size, 10)
      assert.ok(info.modifiedTime instanceof Date && !Number.isNaN(info.modifiedTime.getTime()), 'modifiedTime')

      await sbx.files.makeDir(`${workDir}/sub`)
      const listed = await sbx.files.list(workDir)
      const names = Object.fromEntries(listed.map((e) => [e.name, e.type]))
      assert.deepEqual(names, { 'a.txt': 'file', sub: 'dir' })
      const aEntry = listed.find((e) => e.name === 'a.txt')
      assert.equal(aEntry.path, a)
      assert.equal(aEntry.size, 10)

      const b = `${workDir}/b.txt`
      const renamed = await sbx.files.rename(a, b)
      assert.equal(renamed.path, b)
      assert.equal(renamed.name, 'b.txt')
      assert.equal(await sbx.files.exists(a), false)
      assert.equal(await sbx.files.read(b), 'hello e2b\n')

      await sbx.files.remove(b)
      assert.equal(await sbx.files.exists(b), false)
      await sbx.files.remove(`${workDir}/sub`)
      assert.deepEqual(await sbx.files.list(workDir), [])
      // What the commands see is what the files API wrote.
      await sbx.files.write(`${workDir}/seen.txt`, 'by files\n')
      assert.equal((await sbx.commands.run(`cat ${workDir}/seen.txt`)).stdout, 'by files\n')
    })

    it('file metadata: kept on write, shown by getInfo and list, replaced by the next write', { timeout: 60_000 }, async () => {
      const path = `${workDir}/meta/tagged.txt`
      const metadata = { author: 'mish', purpose: 'upload' }
      const written = await sbx.files.write(path, 'tagged\n', { metadata })
      assert.deepEqual(written.metadata, metadata)
      const info = await sbx.files.getInfo(path)
      assert.deepEqual(info.metadata, metadata)
      assert.equal(info.owner, 'user', "E2B's user owns what it writes, by name")
      const listed = (await sbx.files.list(`${workDir}/meta`)).find((e) => e.name === 'tagged.txt')
      assert.deepEqual(listed?.metadata, metadata)
      await sbx.files.write(path, 'untagged\n')
      assert.equal((await sbx.files.getInfo(path)).metadata, undefined)
    })

    it('a missing file: FileNotFoundError from read and getInfo', { timeout: 60_000 }, async () => {
      await rejectsWith(sbx.files.read(`${workDir}/nope`), FileNotFoundError, 'read of a missing file')
      await rejectsWith(sbx.files.getInfo(`${workDir}/nope`), FileNotFoundError, 'getInfo of a missing file')
    })

    it('write makes missing parent directories; binary content round-trips', { timeout: 60_000 }, async () => {
      const path = `${workDir}/deep/er/bytes.bin`
      const bytes = new Uint8Array(256).map((_, i) => i)
      await sbx.files.write(path, new Blob([bytes]))
      const back = await sbx.files.read(path, { format: 'bytes' })
      assert.deepEqual(Buffer.from(back), Buffer.from(bytes))
    })

    it('a 10 MiB upload reads back equal', { timeout: 180_000 }, async () => {
      const size = 10 * 1024 * 1024
      const data = new Uint8Array(randomBytes(size))
      const path = `${workDir}/upload-10MiB.bin`
      const info = await sbx.files.write(path, new Blob([data]), { requestTimeoutMs: 120_000 })
      assert.equal(info.path, path)
      assert.equal((await sbx.files.getInfo(path)).size, size)
      const back = await sbx.files.read(path, { format: 'bytes', requestTimeoutMs: 120_000 })
      assert.equal(back.length, size)
      assert.equal(sha256(back), sha256(data))

      // As a stream: with envd 0.5.7+ the SDK sends it as one
      // application/octet-stream body, unbuffered (older: multipart).
      const streamed = `${workDir}/upload-10MiB-stream.bin`
      await sbx.files.write(streamed, new Blob([data]).stream(), { requestTimeoutMs: 120_000 })
      const back2 = await sbx.files.read(streamed, { format: 'bytes', requestTimeoutMs: 120_000 })
      assert.equal(sha256(back2), sha256(data))
    })
  })

  it('pty: create with a size, type, resize, reattach, exit', { timeout: 60_000 }, async () => {
    const decoder = new TextDecoder()
    let first = ''
    const term = await sbx.pty.create({
      cols: 80,
      rows: 24,
      envs: { PTY_TEST: 'on-the-terminal' },
      onData: (d) => {
        first += decoder.decode(d)
      },
      requestTimeoutMs: 30_000,
    })
    const until = async (what, cond) => {
      const deadline = Date.now() + 20_000
      while (!cond()) {
        assert.ok(Date.now() < deadline, `timed out waiting for ${what}; the terminal showed ${JSON.stringify(first + second)}`)
        await sleep(50)
      }
    }
    let second = ''
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo "v=$PTY_TEST"; stty size\n'))
    await until('the env and the size', () => first.includes('v=on-the-terminal') && first.includes('24 80'))
    await sbx.pty.resize(term.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
    await until('the new size', () => first.includes('40 120'))
    await term.disconnect()
    const again = await sbx.pty.connect(term.pid, {
      onData: (d) => {
        second += decoder.decode(d)
      },
    })
    assert.equal(again.pid, term.pid)
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo "again=$PTY_TEST"; exit 0\n'))
    const r = await withTimeout(again.wait(), 20_000, 'the terminal to end')
    assert.equal(r.exitCode, 0)
    assert.ok(second.includes('again=on-the-terminal'), `the reattached handle got ${JSON.stringify(second)}`)
    assert.equal(await sbx.pty.kill(term.pid), false, 'a terminal that ended is not there to kill')
  })

  it('setTimeout moves the end both ways', { timeout: 60_000 }, async () => {
    await sbx.setTimeout(20 * 60_000)
    let info = await Sandbox.getInfo(sbx.sandboxId)
    let want = Date.now() + 20 * 60_000
    assert.ok(Math.abs(info.endAt.getTime() - want) < clockSlackMs, `endAt ${info.endAt.toISOString()}, want about ${new Date(want).toISOString()}`)
    await sbx.setTimeout(12 * 60_000)
    info = await Sandbox.getInfo(sbx.sandboxId)
    want = Date.now() + 12 * 60_000
    assert.ok(Math.abs(info.endAt.getTime() - want) < clockSlackMs, `endAt ${info.endAt.toISOString()}, want about ${new Date(want).toISOString()}`)
    assert.equal(await sbx.isRunning({ requestTimeoutMs: 15_000 }), true)
  })

  it('list finds the sandbox by its metadata', { timeout: 90_000 }, async () => {
    const mine = await listAll({ query: { metadata: { run: runId } } })
    assert.ok(mine.some((s) => s.sandboxId === sbx.sandboxId), `Sandbox.list by run=${runId} finds ${sbx.sandboxId}: ${JSON.stringify(mine.map((s) => s.sandboxId))}`)
    for (const s of mine) assert.equal(s.metadata.run, runId, `${s.sandboxId} matches the filter`)
    const found = mine.find((s) => s.sandboxId === sbx.sandboxId)
    assert.equal(found.state, 'running')
    assert.equal(found.metadata.suite, metadata.suite)

    // Filters combine with AND.
    const both = await listAll({ query: { metadata } })
    assert.ok(both.some((s) => s.sandboxId === sbx.sandboxId), 'both metadata keys match')
    const none = await listAll({ query: { metadata: { suite: metadata.suite, run: `${runId}-other` } } })
    assert.equal(none.some((s) => s.sandboxId === sbx.sandboxId), false, 'a value that differs excludes it')

    const running = await listAll({ query: { metadata: { run: runId }, state: ['running'] } })
    assert.ok(running.some((s) => s.sandboxId === sbx.sandboxId), 'state running includes it')
    const paused = await listAll({ query: { metadata: { run: runId }, state: ['paused'] } })
    assert.equal(paused.some((s) => s.sandboxId === sbx.sandboxId), false, 'state paused excludes it')
  })

  it('getMetrics answers for the sandbox', { timeout: 60_000 }, async () => {
    const metrics = await Sandbox.getMetrics(sbx.sandboxId)
    assert.ok(Array.isArray(metrics))
  })

  it("another principal's key sees none of it", { timeout: 120_000 }, async () => {
    const other = { apiKey: cfg.otherApiKey, requestTimeoutMs: 30_000 }
    const id = sbx.sandboxId
    await rejectsWith(Sandbox.getInfo(id, other), SandboxNotFoundError, "getInfo with another's key")
    await rejectsWith(Sandbox.connect(id, other), SandboxNotFoundError, "connect with another's key")
    await rejectsWith(Sandbox.setTimeout(id, 60_000, other), SandboxNotFoundError, "setTimeout with another's key")
    await rejectsWith(Sandbox.getMetrics(id, other), SandboxNotFoundError, "getMetrics with another's key")
    await rejectsWith(Sandbox.pause(id, other), SandboxNotFoundError, "pause with another's key")
    // The SDK's kill reads E2B's 404 as "not found": false, not an error.
    assert.equal(await Sandbox.kill(id, other), false, "kill with another's key finds nothing")

    assert.deepEqual(await listAll({ ...other, query: { metadata: { run: runId } } }), [], "list by this run's metadata with another's key")
    const everything = await listAll(other)
    assert.equal(everything.some((s) => s.metadata?.run === runId || s.sandboxId === id), false, "another's unfiltered list holds none of this run's sandboxes")

    // And the owner's sandbox is untouched by all of it.
    assert.equal((await Sandbox.getInfo(id)).state, 'running')
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
  })

  it('the router refuses envd traffic without the sandbox token', { timeout: 120_000 }, async () => {
    const path = `${workDir}/token.txt`
    await sbx.files.write(path, 'secret\n')
    const file = `/files?path=${encodeURIComponent(path)}`

    // The same request with the sandbox's own token: what the others lack.
    let res = await rawFetch(file, { sandboxId: sbx.sandboxId, token: sbx.envdAccessToken })
    assert.equal(res.status, 200, 'with the token')
    assert.equal(await res.text(), 'secret\n')

    res = await rawFetch(file, { sandboxId: sbx.sandboxId })
    assert.equal(res.status, 401, 'without X-Access-Token')
    assert.doesNotMatch(await res.text(), /secret/)
    res = await rawFetch(file, { sandboxId: sbx.sandboxId, token: 'wrong' })
    assert.equal(res.status, 401, 'with a wrong X-Access-Token')
    assert.doesNotMatch(await res.text(), /secret/)
    res = await rawFetch(file, { sandboxId: sbx.sandboxId, token: '' })
    assert.equal(res.status, 401, 'with an empty X-Access-Token')
    await res.body?.cancel()

    // Connect-RPC too, not only /files.
    const stat = '/filesystem.Filesystem/Stat'
    const body = JSON.stringify({ path })
    res = await rawFetch(stat, { sandboxId: sbx.sandboxId, token: sbx.envdAccessToken, method: 'POST', body, contentType: 'application/json' })
    assert.equal(res.status, 200, 'Stat with the token')
    await res.body?.cancel()
    res = await rawFetch(stat, { sandboxId: sbx.sandboxId, method: 'POST', body, contentType: 'application/json' })
    assert.equal(res.status, 401, 'Stat without X-Access-Token')
    await res.body?.cancel()
    res = await rawFetch(stat, { sandboxId: sbx.sandboxId, token: 'wrong', method: 'POST', body, contentType: 'application/json' })
    assert.equal(res.status, 401, 'Stat with a wrong X-Access-Token')
    await res.body?.cancel()

    // One sandbox's token opens no other sandbox.
    const other = await second()
    res = await rawFetch(file, { sandboxId: other.sandboxId, token: sbx.envdAccessToken })
    assert.equal(res.status, 401, "another sandbox's token")
    await res.body?.cancel()
  })

  it('create of an unknown template: 404, read by the SDK as such', { timeout: 60_000 }, async () => {
    const name = `e2b-test-no-such-template-${runId}`
    // The SDK maps a create's 404 to SandboxError with statusCode 404 (only
    // the per-sandbox calls map it to SandboxNotFoundError).
    const err = await rejectsWith(
      Sandbox.create(name, { metadata, requestTimeoutMs: 30_000 }).then((s) => tracker.track(s)),
      SandboxError,
      'create of an unknown template',
    )
    assert.ok(err.statusCode === 404 || err instanceof NotFoundError, `statusCode ${err.statusCode}: ${err.message}`)
  })

  it("a create restating E2B's defaults is a sandbox; resume on traffic where the template deletes is refused by name", { timeout: createTestTimeoutMs + 30_000 }, async () => {
    // autoResume false is what E2B's Python SDK sends on every create
    // (autoResume {enabled: false}); the JS SDK sends the same for it.
    const sbx = await create(cfg.template, { lifecycle: { onTimeout: 'kill', autoResume: false } })
    const r = await sbx.commands.run('echo restated', { requestTimeoutMs: 30_000 })
    assert.equal(r.stdout.trim(), 'restated')
    await sbx.kill()
    const err = await rejectsWith(
      Sandbox.create(cfg.template, { metadata, requestTimeoutMs: 30_000, lifecycle: { onTimeout: 'pause', autoResume: true } }).then((s) =>
        tracker.track(s),
      ),
      SandboxError,
      'a create with autoResume true',
    )
    assert.match(err.message, /autoPause/)
  })

  it('a shortened timeout: the sandbox answers no more from its end, and a lengthened one keeps it', { timeout: createTestTimeoutMs + 60_000 }, async () => {
    const short = await create()
    assert.equal((await short.commands.run('echo up')).stdout, 'up\n')
    await short.setTimeout(5_000)
    await sleep(1_000)
    await short.setTimeout(10_000) // lengthened again: still running 6 s on
    await sleep(6_000)
    assert.equal(await short.isRunning({ requestTimeoutMs: 15_000 }), true, 'running 7 s after a 5 s timeout lengthened to 10 s')
    await short.setTimeout(5_000)
    await sleep(6_000)
    // E2B's SDK test: isRunning is false once the end has passed (the reap
    // removes the sandbox later; the router answers it as gone at once).
    assert.equal(await short.isRunning({ requestTimeoutMs: 15_000 }), false, 'running 6 s after a 5 s timeout')
  })

  it('kill: then getInfo, connect and the envd are gone', { timeout: createTestTimeoutMs + 90_000 }, async () => {
    const victim = await second()
    const id = victim.sandboxId
    assert.equal((await victim.commands.run('echo before')).stdout, 'before\n')
    assert.equal(await victim.kill(), true)
    await rejectsWith(Sandbox.getInfo(id), SandboxNotFoundError, 'getInfo after kill')
    await rejectsWith(Sandbox.connect(id, { requestTimeoutMs: 30_000 }), SandboxNotFoundError, 'connect after kill')
    assert.equal(await Sandbox.kill(id), false, 'a second kill finds nothing')
    const listed = await listAll({ query: { metadata: { run: runId } } })
    assert.equal(listed.some((s) => s.sandboxId === id), false, 'list no longer shows it')
    // The old handle's envd stops answering (the Pod may take a moment to
    // go; E2B's own is gone at once).
    const deadline = Date.now() + 30_000
    for (;;) {
      const ok = await victim.commands.run('echo after', { requestTimeoutMs: 5_000 }).then(() => true, () => false)
      if (!ok) break
      assert.ok(Date.now() < deadline, 'a killed sandbox still runs commands after 30 s')
      await sleep(1_000)
    }
  })

  describe('pause and connect', () => {
    const skip = cfg.pauseTemplate ? false : 'E2B_PAUSE_TEMPLATE is unset (a template whose sandboxes can pause)'
    it('pause keeps the files; connect resumes', { skip, timeout: 2 * createTestTimeoutMs + 120_000 }, async () => {
      const p = await create(cfg.pauseTemplate)
      const id = p.sandboxId
      const path = `${cfg.pauseDir}/e2b-pause-${runId}.txt`
      await p.files.write(path, 'kept across a pause\n')
      assert.equal(await p.pause({ requestTimeoutMs: 120_000 }), true, 'pause of a running sandbox')
      assert.equal((await Sandbox.getInfo(id)).state, 'paused')
      const paused = await listAll({ query: { metadata: { run: runId }, state: ['paused'] } })
      assert.ok(paused.some((s) => s.sandboxId === id), 'list with state paused shows it')
      // E2B answers 409 to a pause of a paused sandbox; the SDK reads false.
      assert.equal(await Sandbox.pause(id, { requestTimeoutMs: 60_000 }), false, 'pause of a paused sandbox')

      const resumed = await Sandbox.connect(id, { timeoutMs: sandboxTimeoutMs, requestTimeoutMs: createRequestTimeoutMs })
      assert.equal(resumed.sandboxId, id)
      assert.equal((await Sandbox.getInfo(id)).state, 'running')
      assert.equal(await resumed.files.read(path), 'kept across a pause\n')
      assert.equal((await resumed.commands.run(`cat ${path}`)).stdout, 'kept across a pause\n')
      // Connect to a running sandbox is a no-op that answers the same.
      const again = await Sandbox.connect(id, { requestTimeoutMs: 60_000 })
      assert.equal((await again.commands.run('echo running')).stdout, 'running\n')
      await resumed.files.remove(path).catch(() => {})
    })

    it('resume on traffic: a paused sandbox with autoResume answers its next command', { skip, timeout: 2 * createTestTimeoutMs + 120_000 }, async () => {
      const p = await create(cfg.pauseTemplate, { lifecycle: { onTimeout: 'pause', autoResume: true } })
      const id = p.sandboxId
      const path = `${cfg.pauseDir}/e2b-wake-${runId}.txt`
      await p.files.write(path, 'kept across a wake\n')
      assert.equal(await p.pause({ requestTimeoutMs: 120_000 }), true, 'pause of a running sandbox')
      assert.equal((await Sandbox.getInfo(id)).state, 'paused')
      // No connect: the same handle's next calls wake it, all at once.
      const outs = await Promise.all([1, 2, 3].map((i) => p.commands.run(`echo woken ${i}`, { requestTimeoutMs: createRequestTimeoutMs })))
      assert.deepEqual(outs.map((r) => r.stdout), ['woken 1\n', 'woken 2\n', 'woken 3\n'])
      assert.equal((await Sandbox.getInfo(id)).state, 'running')
      assert.equal(await p.files.read(path), 'kept across a wake\n')
      // A request without its token neither wakes nor reaches it.
      assert.equal(await p.pause({ requestTimeoutMs: 120_000 }), true, 'a second pause')
      const intruder = await fetch(`${cfg.sandboxUrl}/health`, {
        headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': envdPort, 'X-Access-Token': 'not-its-token' },
        signal: AbortSignal.timeout(30_000),
      })
      assert.equal(intruder.status, 401, 'a wrong token is refused')
      await sleep(2_000)
      assert.equal((await Sandbox.getInfo(id)).state, 'paused', 'a wrong token woke the sandbox')
      await Sandbox.kill(id)
    })
  })
})
