// Every TypeScript block of the READMEs, type-checked as a user's own file
// would be: each block a module of its own (so each needs its imports),
// against the packed package and the libraries installed here, with
// `tsc --strict`, on the oldest and the newest TypeScript the package
// supports (this project's lockfile pins both).

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { REPO } from "./servers.mjs";

const READMES = ["clients/node/README.md", "examples/express-gateway/README.md"];
// The TypeScript the package supports: the oldest, and the newest (package.json aliases).
const COMPILERS = { oldest: "typescript-oldest", newest: "typescript" };

/** The ```ts blocks of a Markdown text, with the line each starts on. */
function blocks(text) {
  const found = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(ts|typescript)\s*$/.exec(lines[i]);
    if (!open) continue;
    const start = i + 1;
    while (i + 1 < lines.length && !/^```\s*$/.test(lines[i + 1])) i++;
    found.push({ line: start + 1, code: lines.slice(start, i + 1).join("\n") });
    i++;
  }
  return found;
}

const dir = join(process.cwd(), "readme-ts");
const snippets = [];
for (const readme of READMES) {
  for (const b of blocks(readFileSync(join(REPO, readme), "utf8"))) {
    const name = `${readme.replace(/[/.]/g, "_")}_L${b.line}.ts`;
    snippets.push({ readme, ...b, name });
  }
}

test("the READMEs' TypeScript blocks are there, and each has its imports", () => {
  assert.ok(snippets.length >= 10, `found ${snippets.length} blocks`);
  for (const s of snippets) {
    assert.match(s.code, /^import /m, `${s.readme} line ${s.line}: no import`);
  }
});

for (const [which, pkg] of Object.entries(COMPILERS)) {
  test(`every README TypeScript block compiles under tsc --strict, ${which} TypeScript`, () => {
    const tsc = join(process.cwd(), "node_modules", pkg, "bin", "tsc");
    assert.ok(existsSync(tsc), `${pkg} is not installed`);
    const version = JSON.parse(readFileSync(join(process.cwd(), "node_modules", pkg, "package.json"), "utf8")).version;
    const here = join(dir, which);
    rmSync(here, { recursive: true, force: true });
    mkdirSync(here, { recursive: true });
    for (const s of snippets) writeFileSync(join(here, s.name), `${s.code}\n`);
    writeFileSync(
      join(here, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          strict: true,
          target: "es2022",
          module: "nodenext",
          moduleResolution: "nodenext",
          types: ["node"],
          noEmit: true,
          skipLibCheck: false,
        },
        include: ["*.ts"],
      }),
    );
    const run = spawnSync(process.execPath, [tsc, "-p", here], { encoding: "utf8" });
    const out = `${run.stdout}${run.stderr}`;
    // Name the README line each error is on.
    const located = out.replace(/(\S+?)_L(\d+)\.ts\((\d+),/g, (_m, file, start, line) => {
      const readme = READMES.find((r) => r.replace(/[/.]/g, "_") === file) ?? file;
      return `${readme}:${Number(start) + Number(line) - 1} (`;
    });
    assert.equal(run.status, 0, `TypeScript ${version}:\n${located}`);
  });
}

test("the failing case fails: a type error in a block is reported", () => {
  const tsc = join(process.cwd(), "node_modules", COMPILERS.newest, "bin", "tsc");
  const here = join(dir, "broken");
  rmSync(here, { recursive: true, force: true });
  mkdirSync(here, { recursive: true });
  writeFileSync(
    join(here, "a.ts"),
    'import { Bucket } from "redis-tokenbucket";\nnew Bucket({ max: "ten" as unknown as number, rate: 1 }).nope;\n',
  );
  writeFileSync(
    join(here, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: { strict: true, module: "nodenext", noEmit: true, types: ["node"] },
      include: ["*.ts"],
    }),
  );
  const run = spawnSync(process.execPath, [tsc, "-p", here], { encoding: "utf8" });
  assert.notEqual(run.status, 0);
  assert.match(run.stdout, /Property 'nope' does not exist/);
});
