/**
 * `ipwarden --version`, `-V` and the `version` verb through runMain: the flag prints the version
 * line alone and exits 0 (as `kubectl`/`helm`-style tools and commander's convention do); the verb
 * keeps its four lines.
 */
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';
import type { CliContext } from '../../src/cli/context.ts';
import { runMain, VERSION } from '../../src/cli/main.ts';

async function run(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const ctx: CliContext = { stdout: (t) => void (stdout += t), stderr: (t) => void (stderr += t), env: {}, now: () => 0 };
  const code = await runMain(argv, ctx);
  return { code, stdout, stderr };
}

describe('ipwarden --version', () => {
  for (const flag of ['--version', '-V']) {
    it(`${flag} prints "ipwarden ${VERSION}" and exits 0`, async () => {
      const r = await run([flag]);
      assert.deepEqual(r, { code: 0, stdout: `ipwarden ${VERSION}\n`, stderr: '' });
    });
  }
  it('the version verb still prints the version, Node.js, the CNI versions and the flock binding', async () => {
    const r = await run(['version']);
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trimEnd().split('\n');
    assert.equal(lines.length, 4);
    assert.equal(lines[0], `ipwarden ${VERSION}`);
    assert.equal(lines[1], `Node.js ${process.version}`);
    assert.match(lines[2] as string, /^CNI protocol versions supported: 0\.1\.0, .*1\.1\.0$/);
  });
});
