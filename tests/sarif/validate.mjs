// Validates SARIF files against the official SARIF 2.1.0 JSON schema (draft-04), which the npm
// package @microsoft/jest-sarif ships as lib/schemas/sarif-2.1.0-rtm.5.json.
// Usage: node validate.mjs FILE.sarif...   Exit 0 when every file validates, 1 otherwise.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import Ajv from "ajv-draft-04";
import addFormats from "ajv-formats";

const require = createRequire(import.meta.url);
const schemaPath = require.resolve("@microsoft/jest-sarif/lib/schemas/sarif-2.1.0-rtm.5.json");
const schema = JSON.parse(readFileSync(schemaPath, "utf8"));
// unicodeRegExp: false because the schema's language pattern has a stray "]" that only a
// non-unicode RegExp accepts (as a literal).
const ajv = new Ajv({ allErrors: true, strict: false, unicodeRegExp: false });
addFormats(ajv);
const validate = ajv.compile(schema);

let failed = 0;
for (const file of process.argv.slice(2)) {
  const doc = JSON.parse(readFileSync(file, "utf8"));
  if (validate(doc)) {
    console.log(`${file}: valid SARIF 2.1.0 (${doc.runs[0].results.length} results)`);
  } else {
    failed++;
    console.log(`${file}: INVALID`);
    for (const e of validate.errors.slice(0, 20)) console.log(`  ${e.instancePath} ${e.message}`);
  }
}
process.exit(failed ? 1 : 0);
