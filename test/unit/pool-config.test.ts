/** `ipam.pool` decoding (src/ipam/pool-config.ts, through loadIPAMConfig): defaults and every error text, exactly. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { isAppError } from '../../src/common/errors.ts';
import { loadIPAMConfig, loadNetworkIdentity } from '../../src/ipam/config.ts';
import { isPoolKeyNearMiss } from '../../src/ipam/pool-config.ts';

const ETCD = { endpoints: ['http://127.0.0.1:2379'] };
function conf(ipamExtra: Record<string, unknown>): string {
  return JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/16' }]], ...ipamExtra } });
}

describe('ipam.pool', () => {
  it('decodes with defaults: blocks /26 and /122, prefix /ipwarden, no node name', () => {
    const c = loadIPAMConfig(conf({ pool: { name: 'p1', etcd: ETCD } }), undefined);
    assert.deepEqual(c.pool, {
      name: 'p1',
      etcd: { endpoints: ['http://127.0.0.1:2379'], tls: null, prefix: '/ipwarden' },
      blockSize4: 26,
      blockSize6: 122,
      nodeName: null,
    });
  });

  it('decodes every key', () => {
    const c = loadIPAMConfig(
      conf({
        nodeName: 'worker-1',
        pool: {
          name: 'p1',
          blockSize: 28,
          blockSize6: 120,
          etcd: { endpoints: ['https://10.0.0.5:2379', 'https://[fd80::5]:2379'], prefix: '/x/y', tls: { ca: '/etc/ca.pem', cert: '/etc/c.pem', key: '/etc/k.pem' }, credentials: '/etc/ipwarden/etcd.json' },
        },
      }),
      undefined,
    );
    assert.deepEqual(c.pool, {
      name: 'p1',
      etcd: { endpoints: ['https://10.0.0.5:2379', 'https://[fd80::5]:2379'], tls: { ca: '/etc/ca.pem', cert: '/etc/c.pem', key: '/etc/k.pem' }, prefix: '/x/y', credentials: '/etc/ipwarden/etcd.json' },
      blockSize4: 28,
      blockSize6: 120,
      nodeName: 'worker-1',
    });
  });

  it('reclaimAfter: a Go duration in milliseconds; "0" and absent are off (no key in the decoded value)', () => {
    const dec = (v: unknown) => loadIPAMConfig(conf({ pool: { name: 'p1', etcd: ETCD, ...(v === undefined ? {} : { reclaimAfter: v }) } }), undefined).pool;
    assert.equal(dec('10m')?.reclaimAfterMs, 600_000);
    assert.equal(dec('1h30m')?.reclaimAfterMs, 5_400_000);
    assert.equal(dec('1s')?.reclaimAfterMs, 1_000);
    assert.equal(dec('720h')?.reclaimAfterMs, 2_592_000_000);
    assert.equal('reclaimAfterMs' in (dec('0') ?? {}), false);
    assert.equal('reclaimAfterMs' in (dec('0s') ?? {}), false);
    assert.equal('reclaimAfterMs' in (dec(undefined) ?? {}), false);
  });

  it('a config without pool has no pool key (unchanged)', () => {
    assert.equal('pool' in loadIPAMConfig(conf({}), undefined), false);
  });

  it('DEL sees the pool even when ranges no longer parse', () => {
    const id = loadNetworkIdentity(JSON.stringify({ name: 'net1', ipam: { ranges: 'garbage', pool: { name: 'p1', etcd: ETCD } } }));
    assert.equal(id.pool?.name, 'p1');
  });

  const errors: Array<[string, Record<string, unknown>, string]> = [
    ['pool not an object', { pool: 3 }, 'ipam.pool must be an object, got number'],
    ['pool null (a template\'s missing value: never "no pool", trial finding 2)', { pool: null }, 'ipam.pool must be an object, got null'],
    ['"Pool" (a case variant: host-local-style matching would take it)', { Pool: { name: 'p1', etcd: ETCD } }, 'ipam has the key "Pool": pool keys are matched exactly; write "pool"'],
    ['"nodename"', { nodename: 'n1', pool: { name: 'p1', etcd: ETCD } }, 'ipam has the key "nodename": pool keys are matched exactly; write "nodeName"'],
    ['unknown pool key (trial finding 3: a default would be fixed in meta)', { pool: { name: 'p1', etcd: ETCD, blocksize: 30 } }, 'ipam.pool has an unknown key "blocksize" (known keys: name, etcd, blockSize, blockSize6, offline, reclaimAfter)'],
    ['reclaimAfter a number (durations are strings)', { pool: { name: 'p1', etcd: ETCD, reclaimAfter: 600 } }, 'ipam.pool.reclaimAfter must be a duration such as "10m" (Go syntax: 90s, 1h30m), got 600'],
    ['reclaimAfter null (a template\'s missing value is not "off")', { pool: { name: 'p1', etcd: ETCD, reclaimAfter: null } }, 'ipam.pool.reclaimAfter must be a duration such as "10m" (Go syntax: 90s, 1h30m), got null'],
    ['reclaimAfter without a unit', { pool: { name: 'p1', etcd: ETCD, reclaimAfter: '10' } }, 'ipam.pool.reclaimAfter must be a duration such as "10m" (Go syntax: 90s, 1h30m), got "10"'],
    ['reclaimAfter below 1s', { pool: { name: 'p1', etcd: ETCD, reclaimAfter: '999ms' } }, 'ipam.pool.reclaimAfter must be from 1s to 720h (or "0" for off), got "999ms"'],
    ['reclaimAfter negative', { pool: { name: 'p1', etcd: ETCD, reclaimAfter: '-5m' } }, 'ipam.pool.reclaimAfter must be from 1s to 720h (or "0" for off), got "-5m"'],
    ['reclaimAfter above 720h', { pool: { name: 'p1', etcd: ETCD, reclaimAfter: '721h' } }, 'ipam.pool.reclaimAfter must be from 1s to 720h (or "0" for off), got "721h"'],
    ['unknown etcd key', { pool: { name: 'p1', etcd: { ...ETCD, prefx: '/x' } } }, 'ipam.pool.etcd has an unknown key "prefx" (known keys: endpoints, tls, prefix, credentials)'],
    ['unknown etcd key "password" (credentials go in a file)', { pool: { name: 'p1', etcd: { ...ETCD, password: 'x' } } }, 'ipam.pool.etcd has an unknown key "password" (known keys: endpoints, tls, prefix, credentials)'],
    ['relative credentials path', { pool: { name: 'p1', etcd: { ...ETCD, credentials: 'etcd.json' } } }, 'ipam.pool.etcd.credentials must be an absolute path, got "etcd.json"'],
    ['credentials null (a template\'s missing value is not "no authentication")', { pool: { name: 'p1', etcd: { ...ETCD, credentials: null } } }, 'ipam.pool.etcd.credentials must be an absolute path, got null'],
    ['credentials not a string', { pool: { name: 'p1', etcd: { ...ETCD, credentials: { user: 'u' } } } }, 'ipam.pool.etcd.credentials must be an absolute path, got {"user":"u"}'],
    ['unknown tls key', { pool: { name: 'p1', etcd: { endpoints: ['https://a:1'], tls: { ca: '/c', crt: '/d' } } } }, 'ipam.pool.etcd.tls has an unknown key "crt" (known keys: ca, cert, key)'],
    ['no name', { pool: { etcd: ETCD } }, "ipam.pool.name must be a name of letters, digits, '_', '.' or '-' starting with a letter or digit, got null"],
    ['bad name', { pool: { name: 'a/b', etcd: ETCD } }, `ipam.pool.name must be a name of letters, digits, '_', '.' or '-' starting with a letter or digit, got "a/b"`],
    ['no etcd', { pool: { name: 'p1' } }, 'ipam.pool.etcd is required'],
    ['etcd not an object', { pool: { name: 'p1', etcd: [] } }, 'ipam.pool.etcd must be an object, got array'],
    ['no endpoints', { pool: { name: 'p1', etcd: {} } }, 'ipam.pool.etcd.endpoints must be a non-empty array of URLs, got null'],
    ['empty endpoints', { pool: { name: 'p1', etcd: { endpoints: [] } } }, 'ipam.pool.etcd.endpoints must be a non-empty array of URLs, got []'],
    ['endpoint not a string', { pool: { name: 'p1', etcd: { endpoints: [1] } } }, 'ipam.pool.etcd.endpoints[0] must be a string, got number'],
    ['endpoint without port', { pool: { name: 'p1', etcd: { endpoints: ['http://h'] } } }, 'ipam.pool.etcd.endpoints[0] must be http://HOST:PORT or https://HOST:PORT, got "http://h"'],
    ['endpoint port 0', { pool: { name: 'p1', etcd: { endpoints: ['http://h:0'] } } }, 'ipam.pool.etcd.endpoints[0] must be http://HOST:PORT or https://HOST:PORT, got "http://h:0"'],
    ['mixed schemes', { pool: { name: 'p1', etcd: { endpoints: ['http://a:1', 'https://b:2'], tls: { ca: '/c' } } } }, 'ipam.pool.etcd.endpoints mix http:// and https://'],
    ['https without tls', { pool: { name: 'p1', etcd: { endpoints: ['https://a:1'] } } }, 'ipam.pool.etcd.tls.ca is required with https:// endpoints'],
    ['tls without ca', { pool: { name: 'p1', etcd: { endpoints: ['https://a:1'], tls: {} } } }, 'ipam.pool.etcd.tls.ca is required with https:// endpoints'],
    ['tls with http', { pool: { name: 'p1', etcd: { endpoints: ['http://a:1'], tls: { ca: '/c' } } } }, 'ipam.pool.etcd.tls is given but the endpoints are http://'],
    ['relative ca', { pool: { name: 'p1', etcd: { endpoints: ['https://a:1'], tls: { ca: 'c.pem' } } } }, 'ipam.pool.etcd.tls.ca must be an absolute path, got "c.pem"'],
    ['cert without key', { pool: { name: 'p1', etcd: { endpoints: ['https://a:1'], tls: { ca: '/c', cert: '/d' } } } }, 'ipam.pool.etcd.tls.cert and ipam.pool.etcd.tls.key must be given together'],
    ['bad prefix', { pool: { name: 'p1', etcd: { ...ETCD, prefix: 'x/' } } }, `ipam.pool.etcd.prefix must be /-separated names of letters, digits, '_', '.' or '-' without a trailing /, got "x/"`],
    ['blockSize too small (a /23 block is > 64 KB of JSON per write when full)', { pool: { name: 'p1', etcd: ETCD, blockSize: 23 } }, 'ipam.pool.blockSize must be an integer from 24 to 32, got 23'],
    ['blockSize not integer', { pool: { name: 'p1', etcd: ETCD, blockSize: '26' } }, 'ipam.pool.blockSize must be an integer from 24 to 32, got "26"'],
    ['blockSize6 too small', { pool: { name: 'p1', etcd: ETCD, blockSize6: 119 } }, 'ipam.pool.blockSize6 must be an integer from 120 to 128, got 119'],
    ['blockSize null (review B3: the default would cut the range into other blocks)', { pool: { name: 'p1', etcd: ETCD, blockSize: null } }, 'ipam.pool.blockSize must be an integer from 24 to 32, got null'],
    ['blockSize6 null', { pool: { name: 'p1', etcd: ETCD, blockSize6: null } }, 'ipam.pool.blockSize6 must be an integer from 120 to 128, got null'],
    ['prefix null (review B3: the default prefix would be a second pool over the same ranges)', { pool: { name: 'p1', etcd: { ...ETCD, prefix: null } } }, `ipam.pool.etcd.prefix must be /-separated names of letters, digits, '_', '.' or '-' without a trailing /, got null`],
    ['blockSize6 too big', { pool: { name: 'p1', etcd: ETCD, blockSize6: 129 } }, 'ipam.pool.blockSize6 must be an integer from 120 to 128, got 129'],
    ['bad nodeName', { nodeName: 'a b', pool: { name: 'p1', etcd: ETCD } }, `ipam.nodeName must be a node name of at most 253 letters, digits, '_', '.' or '-' starting with a letter or digit, got "a b"`],
  ];
  for (const [name, extra, msg] of errors) {
    it(`${name}: IPAM_INVALID_CONFIG (CNI 7) "${msg}"`, () => {
      assert.throws(() => loadIPAMConfig(conf(extra), undefined), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.cniCode === 7 && e.message === msg);
    });
  }

  it('refuses static requests on a pool network', () => {
    assert.throws(
      () => loadIPAMConfig(conf({ pool: { name: 'p1', etcd: ETCD } }), 'IP=10.80.0.9'),
      (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.message === 'ipam.pool does not support static IP requests (CNI_ARGS IP=, args.cni.ips, runtimeConfig.ips)',
    );
  });
});

describe('a pool key misspelt or outside ipam (two nodes handing out one address from node-local files)', () => {
  const near = (k: string): string =>
    `ipam key ${JSON.stringify(k)} looks like a misspelt "pool": a cluster pool's key is "pool" (inside "ipam"); refused so that the pool's addresses are not handed out from node-local files`;
  const outside = (k: string): string =>
    `network config key ${JSON.stringify(k)} is outside "ipam": a cluster pool's key is "pool" inside "ipam"; refused so that the pool's addresses are not handed out from node-local files`;
  const POOL = { name: 'net1-pool', etcd: ETCD };
  const refused = (stdin: string, msg: string): void => {
    assert.throws(() => loadIPAMConfig(stdin, undefined), (e: unknown) => isAppError(e, 'IPAM_INVALID_CONFIG') && e.cniCode === 7 && e.message === msg && e.details === undefined);
  };

  it('isPoolKeyNearMiss: one edit from "pool", case ignored; "pool" and its case variants are not near misses', () => {
    const yes = ['pools', 'Pools', 'POOLS', 'pool_', 'pool-', '_pool', 'poool', 'pol', 'pood', 'ppol', 'opol', 'polo', 'poll', 'spool', 'pool1', 'pooL_'];
    const no = ['pool', 'Pool', 'POOL', 'pooling', 'pool_name', 'poolName', 'ipPool', 'ipv4_pools', 'ipv6_pools', 'po', 'loop', 'p', '', 'type', 'ranges', 'routes', 'dataDir', 'resolvConf', 'subnet', 'rangeStart', 'rangeEnd', 'gateway', 'nodeName', 'range', 'range_start', 'range_end', 'exclude', 'etcd_host', 'ipRanges', 'kubernetes', 'network_name', 'log_level', 'assign_ipv4'];
    assert.deepEqual(yes.filter((k) => !isPoolKeyNearMiss(k)), []);
    assert.deepEqual(no.filter((k) => isPoolKeyNearMiss(k)), []);
  });

  const nearMisses: Array<[string, Record<string, unknown>, string]> = [
    ['"pools" (the trial\'s config)', { pools: POOL }, 'pools'],
    ['"Pools"', { Pools: POOL }, 'Pools'],
    ['"pool_"', { pool_: POOL }, 'pool_'],
    ['"poool"', { poool: POOL }, 'poool'],
    ['"pol"', { pol: POOL }, 'pol'],
    ['"opol" (two letters swapped)', { opol: POOL }, 'opol'],
    ['"poll" (also with a value that is no pool)', { poll: 5 }, 'poll'],
    ['"pools": null', { pools: null }, 'pools'],
    ['the first of two near misses', { pol: POOL, pools: POOL }, 'pol'],
  ];
  for (const [name, extra, key] of nearMisses) {
    it(`ipam ${name}, no "pool": refused, code 7, naming the key`, () => refused(conf(extra), near(key)));
  }

  it('"pool" at the network config\'s top level (beside a main plugin\'s keys): refused, code 7', () => {
    refused(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', type: 'macvlan', master: 'eth0', pool: POOL, ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]] } }), outside('pool'));
  });

  it('"Pool" or "pool": null at the top level: refused, code 7', () => {
    refused(JSON.stringify({ name: 'net1', Pool: POOL, ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]] } }), outside('Pool'));
    refused(JSON.stringify({ name: 'net1', pool: null, ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]] } }), outside('pool'));
  });

  it('a near miss in ipam is named before a pool outside it', () => {
    refused(JSON.stringify({ name: 'net1', pool: POOL, ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]], pools: POOL } }), near('pools'));
  });

  it('the ipam type found as Go finds it ("Type" when there is no "type")', () => {
    refused(JSON.stringify({ name: 'net1', ipam: { Type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]], pools: POOL } }), near('pools'));
  });

  it('accepted: a real "pool" beside a near miss or a top-level "pool" (the pool is used)', () => {
    const a = loadIPAMConfig(conf({ pool: POOL, pools: 1 }), undefined);
    assert.equal(a.pool?.name, 'net1-pool');
    const b = loadIPAMConfig(JSON.stringify({ name: 'net1', pool: 'x', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]], pool: POOL } }), undefined);
    assert.equal(b.pool?.name, 'net1-pool');
  });

  it('accepted: another ipam type (host-local, when ipwarden is installed under that name) is not judged', () => {
    const a = loadIPAMConfig(JSON.stringify({ name: 'net1', pool: POOL, ipam: { type: 'host-local', ranges: [[{ subnet: '10.80.0.0/24' }]], pools: POOL } }), undefined);
    assert.equal('pool' in a, false);
    assert.equal(a.type, 'host-local');
    const b = loadIPAMConfig(JSON.stringify({ name: 'net1', ipam: { type: 'IPWarden', ranges: [[{ subnet: '10.80.0.0/24' }]], pools: POOL } }), undefined);
    assert.equal('pool' in b, false);
  });

  it('accepted: keys of host-local, whereabouts and calico-ipam, and keys that only contain "pool", in an ipwarden ipam', () => {
    const c = loadIPAMConfig(
      conf({ range: '10.80.0.0/24', range_start: '10.80.0.5', exclude: [], etcd_host: 'x', ipRanges: [], ipv4_pools: ['a'], assign_ipv4: 'true', poolName: 'p', pool_name: 'p', routes: [], resolvConf: '' }),
      undefined,
    );
    assert.equal('pool' in c, false);
    assert.equal(c.name, 'net1');
  });

  it('accepted: a top-level key that only contains "pool" ("pools", "ipPool": a main plugin\'s own)', () => {
    const c = loadIPAMConfig(JSON.stringify({ name: 'net1', pools: ['a'], ipPool: 'b', ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]] } }), undefined);
    assert.equal('pool' in c, false);
  });

  it('DEL (loadNetworkIdentity) does not refuse them: the node-local identity, so a DEL releases what an older version handed out', () => {
    const ipam = { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]], pools: POOL };
    assert.deepEqual(loadNetworkIdentity(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', ipam })), { cniVersion: '1.0.0', name: 'net1', dataDir: '/var/lib/cni/networks', lockTimeoutSeconds: 30 });
    assert.deepEqual(
      loadNetworkIdentity(JSON.stringify({ cniVersion: '1.0.0', name: 'net1', pool: POOL, ipam: { type: 'ipwarden', ranges: [[{ subnet: '10.80.0.0/24' }]] } })),
      { cniVersion: '1.0.0', name: 'net1', dataDir: '/var/lib/cni/networks', lockTimeoutSeconds: 30 },
    );
  });
});
