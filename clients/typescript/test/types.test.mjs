// The shipped declarations compile against a consumer that uses the whole API.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

test('the .d.ts files type-check a consumer (tsc --noEmit)', () => {
    const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
    const project = fileURLToPath(new URL('./types/tsconfig.json', import.meta.url));
    const run = spawnSync(process.execPath, [tsc, '-p', project], { encoding: 'utf8' });
    assert.equal(run.status, 0, run.stdout + run.stderr);
});
