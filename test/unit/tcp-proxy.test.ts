// The fault proxy (test/helpers/tcp-proxy.ts) against a loopback echo server: pass, drop (black
// hole, then reset on heal), delay, reset, switched at run time on open connections. Outcomes
// are decided by the proxy's counters and the echo server's byte count, never by sleeps.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseTarget, startNodeProxies, startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.ts';

/** Poll `cond` every 5 ms until true; throws after `ms` (bounded wait, not an outcome). */
async function until(cond: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

interface Conn {
  sock: Socket;
  got: () => string;
  closed: () => boolean;
  error: () => NodeJS.ErrnoException | null;
}

function open(port: number): Promise<Conn> {
  return new Promise((res, rej) => {
    let got = '';
    let closed = false;
    let error: NodeJS.ErrnoException | null = null;
    const sock = connect({ host: '127.0.0.1', port }, () => res({ sock, got: () => got, closed: () => closed, error: () => error }));
    sock.on('data', (c: Buffer) => (got += c.toString('utf8')));
    sock.on('error', (e: NodeJS.ErrnoException) => {
      error = e;
      rej(e);
    });
    sock.on('close', () => (closed = true));
  });
}

describe('tcp proxy', () => {
  let echo: Server;
  let echoPort = 0;
  let received = 0;
  const sockets = new Set<Socket>();
  const proxies: TcpProxy[] = [];

  before(async () => {
    echo = createServer((s) => {
      sockets.add(s);
      s.on('data', (c: Buffer) => {
        received += c.length;
        s.write(c);
      });
      s.on('error', () => undefined);
      s.on('close', () => sockets.delete(s));
    });
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', () => r()));
    const a = echo.address();
    echoPort = typeof a === 'object' && a !== null ? a.port : 0;
  });
  after(async () => {
    for (const p of proxies) await p.close();
    for (const s of sockets) s.destroy();
    await new Promise<void>((r) => echo.close(() => r()));
  });

  const proxy = async (): Promise<TcpProxy> => {
    const p = await startTcpProxy(`http://127.0.0.1:${echoPort}`);
    proxies.push(p);
    return p;
  };

  it('parses endpoints and refuses bad ones and bad delays', async () => {
    assert.deepEqual(parseTarget('http://127.0.0.1:2379'), { host: '127.0.0.1', port: 2379 });
    assert.deepEqual(parseTarget('127.0.0.1:80/'), { host: '127.0.0.1', port: 80 });
    assert.throws(() => parseTarget('http://127.0.0.1'), TypeError);
    assert.throws(() => parseTarget('127.0.0.1:99999'), TypeError);
    const p = await proxy();
    assert.throws(() => p.setMode({ kind: 'delay', ms: -1 }), RangeError);
    assert.throws(() => p.setMode({ kind: 'delay', ms: Number.NaN }), RangeError);
    assert.equal(p.mode().kind, 'pass');
  });

  it('pass forwards both ways', async () => {
    const p = await proxy();
    assert.match(p.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    const c = await open(p.port);
    c.sock.write('hello');
    await until(() => c.got() === 'hello', 'echo');
    assert.equal(p.stats().forwardedBytes, 10);
    assert.equal(p.stats().accepted, 1);
    c.sock.destroy();
    await until(() => p.stats().open === 0, 'the pipe to close');
  });

  it('drop black-holes an open connection and new ones (accepted, read, never forwarded); leaving drop resets them, a new connection passes', async () => {
    const p = await proxy();
    const c1 = await open(p.port);
    c1.sock.write('a');
    await until(() => c1.got() === 'a', 'echo before the cut');
    const before = received;
    p.setMode({ kind: 'drop' });
    c1.sock.write('bbbb');
    const c2 = await open(p.port); // accepted while dropping
    c2.sock.on('error', () => undefined);
    c2.sock.write('ccc');
    await until(() => p.stats().droppedBytes === 7, 'the proxy to read and discard 7 bytes');
    assert.equal(received, before, 'the target received nothing during drop');
    assert.equal(c1.got(), 'a');
    assert.equal(c2.got(), '');
    assert.equal(c1.closed() || c2.closed(), false, 'a black hole does not close');
    c1.sock.on('error', () => undefined);
    p.setMode({ kind: 'pass' });
    await until(() => c1.closed() && c2.closed(), 'both tainted connections to be reset');
    assert.equal(c1.error()?.code, 'ECONNRESET');
    assert.equal(p.stats().resets, 2);
    const c3 = await open(p.port);
    c3.sock.write('d');
    await until(() => c3.got() === 'd', 'echo after the heal');
    c3.sock.destroy();
  });

  it('delay holds each chunk in its queue, both ways, and keeps the order across a switch back to pass', async () => {
    const p = await proxy();
    const c = await open(p.port);
    p.setMode({ kind: 'delay', ms: 150 });
    const before = received;
    c.sock.write('1');
    // Read by the proxy and held: queued, not yet at the target (decided by the counters, no clock).
    await until(() => p.stats().queuedBytes === 1, "'1' to be queued");
    assert.equal(received, before, 'the target has nothing while the chunk waits');
    // Forwarded after its delay; the echo is queued again on its way back.
    await until(() => received === before + 1, "'1' to reach the target");
    await until(() => c.got() === '1', 'the delayed echo');
    assert.equal(p.stats().forwardedBytes, 2);
    p.setMode({ kind: 'delay', ms: 200 });
    c.sock.write('2');
    // Switch to pass while '2' is queued: '3' is sent after it, and must arrive after it.
    await until(() => p.stats().queuedBytes === 1, "'2' to be queued");
    p.setMode({ kind: 'pass' });
    c.sock.write('3');
    await until(() => c.got() === '123', `ordered echo, got ${JSON.stringify(c.got())}`);
    c.sock.destroy();
  });

  it('reset resets open connections and refuses new ones; pass works again after', async () => {
    const p = await proxy();
    const c1 = await open(p.port);
    c1.sock.on('error', () => undefined);
    p.setMode({ kind: 'reset' });
    await until(() => c1.closed(), 'the open connection to be reset');
    assert.equal(c1.error()?.code, 'ECONNRESET');
    await assert.rejects(
      (async () => {
        const c2 = await open(p.port);
        c2.sock.write('x');
        await until(() => c2.closed(), 'the new connection to be reset');
        throw c2.error() ?? new Error('closed without error');
      })(),
      (e: NodeJS.ErrnoException) => e.code === 'ECONNRESET',
    );
    p.setMode({ kind: 'pass' });
    const c3 = await open(p.port);
    c3.sock.write('ok');
    await until(() => c3.got() === 'ok', 'echo after reset mode');
    c3.sock.destroy();
  });

  it('a target that is down looks like a reset to the client', async () => {
    const dead = createServer();
    await new Promise<void>((r) => dead.listen(0, '127.0.0.1', () => r()));
    const a = dead.address();
    const port = typeof a === 'object' && a !== null ? a.port : 0;
    await new Promise<void>((r) => dead.close(() => r()));
    const p = await startTcpProxy({ host: '127.0.0.1', port });
    proxies.push(p);
    const c = await open(p.port);
    c.sock.on('error', () => undefined);
    await until(() => c.closed(), 'the client to be reset');
    assert.equal(p.stats().resets, 1);
  });

  it('node proxies switch together and close idempotently', async () => {
    const np = await startNodeProxies([`http://127.0.0.1:${echoPort}`, `127.0.0.1:${echoPort}`]);
    assert.equal(np.endpoints.length, 2);
    np.setMode({ kind: 'drop' });
    assert.deepEqual(
      np.proxies.map((p) => p.mode().kind),
      ['drop', 'drop'],
    );
    const c = await open(np.proxies[1]?.port ?? 0);
    c.sock.on('error', () => undefined);
    c.sock.write('zz');
    await until(() => np.proxies[1]?.stats().droppedBytes === 2, 'the drop');
    await np.close();
    await np.close();
    await until(() => c.closed(), 'close to end connections');
  });
});
