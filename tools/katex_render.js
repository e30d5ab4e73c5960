// Typesets formulas with the course's own copy of KaTeX (course/assets/vendor/katex), for tools/math_hook.py.
// stdin: a JSON list of [tex, display]; stdout: a JSON list of HTML strings, one per formula, in order.
// A formula KaTeX cannot parse is rendered as its source in red (throwOnError: false), as in the browser.
"use strict";
const path = require("path");
const katex = require(path.join(__dirname, "..", "course", "assets", "vendor", "katex", "katex.min.js"));
let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const out = JSON.parse(input).map(([tex, display]) =>
    katex.renderToString(String(tex), {displayMode: Boolean(display), throwOnError: false, strict: "ignore"}));
  process.stdout.write(JSON.stringify(out));
});
