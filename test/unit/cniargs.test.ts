import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { goQuote } from '../../src/common/goquote.ts';
import { parseCniArgs } from '../../src/ipam/cniargs.ts';
import { formatIP } from '../../src/common/ip.ts';

describe('parseCniArgs (libcni LoadArgs into host-local IPAMEnvArgs)', () => {
  // [CNI_ARGS, requested IP (text) or null, ignoreUnknown]
  const ok: [string | undefined, string | null, boolean][] = [
    [undefined, null, false],
    ['', null, false],
    ['IP=10.1.0.7', '10.1.0.7', false],
    ['IP=10.1.0.7/24', '10.1.0.7', false], // prefix ignored
    ['IP=fd00::7/64', 'fd00::7', false],
    ['IP=::ffff:10.1.0.7', '10.1.0.7', false],
    ['IP=', null, false], // empty value: no request
    ['IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u', null, true],
    ['K8S_POD_NAME=p;IgnoreUnknown=true', null, true], // order does not matter
    ['IgnoreUnknown=TRUE;BAR=2', null, true], // case-insensitive value
    ['IgnoreUnknown=0', null, false],
    ['IgnoreUnknown=False', null, false],
    ['IP=10.1.0.7;IP=10.1.0.8', '10.1.0.8', false], // later wins
    ['IgnoreUnknown=1;IP=10.1.0.9;X=', '10.1.0.9', true],
  ];
  for (const [args, ip, ignore] of ok) {
    it(`${JSON.stringify(args)} → ip ${ip}, ignoreUnknown ${ignore}`, () => {
      const got = parseCniArgs(args);
      assert.equal(got.ip === null ? null : formatIP(got.ip), ip);
      assert.equal(got.ignoreUnknown, ignore);
    });
  }

  // exact texts as printed by host-local v1.1.1
  const bad: [string, string][] = [
    ['A=b=c', 'ARGS: invalid pair "A=b=c"'],
    ['IgnoreUnknown=1;', 'ARGS: invalid pair ""'],
    ['IgnoreUnknown=0;X=1;Y', 'ARGS: invalid pair "Y"'],
    ['FOO=1;BAR=2', 'ARGS: unknown args ["FOO=1" "BAR=2"]'],
    ['ip=10.1.0.3', 'ARGS: unknown args ["ip=10.1.0.3"]'], // keys are case-sensitive
    ['IgnoreUnknown=0;X=1', 'ARGS: unknown args ["X=1"]'],
    ['X=a\tb"c', 'ARGS: unknown args ["X=a\\tb\\"c"]'],
    ['IP=10.1.0.300', 'ARGS: error parsing value of pair "IP=10.1.0.300": invalid IP address 10.1.0.300'],
    ['IP=10.1.0.5/40', 'ARGS: error parsing value of pair "IP=10.1.0.5/40": invalid IP address 10.1.0.5/40'],
    ['IP=fe80::1%eth0', 'ARGS: error parsing value of pair "IP=fe80::1%eth0": invalid IP address fe80::1%eth0'],
    [
      'IgnoreUnknown=yes',
      'ARGS: error parsing value of pair "IgnoreUnknown=yes": boolean unmarshal error: invalid input yes',
    ],
    [
      'IgnoreUnknown=YES',
      'ARGS: error parsing value of pair "IgnoreUnknown=YES": boolean unmarshal error: invalid input yes',
    ],
    [
      'CommonArgs=1',
      "ARGS: cannot unmarshal into field 'CommonArgs' - type '*types.CommonArgs' does not implement encoding.TextUnmarshaler",
    ],
  ];
  for (const [args, msg] of bad) {
    it(`${JSON.stringify(args)} → ${msg}`, () => {
      assert.throws(() => parseCniArgs(args), { code: 'IPAM_INVALID_ARGS', message: msg });
    });
  }
});

describe('goQuote (Go strconv.Quote)', () => {
  const cases: [string, string][] = [
    ['abc', '"abc"'],
    ['', '""'],
    ['a"b\\c', '"a\\"b\\\\c"'],
    ['\x07\b\f\n\r\t\v', '"\\a\\b\\f\\n\\r\\t\\v"'],
    ['\x00\x1f\x7f', '"\\x00\\x1f\\x7f"'],
    ['héllo ✓', '"héllo ✓"'],
    ['\u00a0\u200b', '"\\u00a0\\u200b"'],
    ['\u{1F600}', '"\u{1F600}"'],
    ['\u{E0001}', '"\\U000e0001"'],
  ];
  for (const [input, want] of cases) {
    it(`${JSON.stringify(input)} → ${want}`, () => assert.equal(goQuote(input), want));
  }
});
