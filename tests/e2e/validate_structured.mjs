// Validates structured outputs against their JSON Schemas with ajv (draft 2020-12, which has
// prefixItems and $defs) plus ajv-formats. Input: a JSON file [{name, schema, output}], where
// output is the raw text the server returned. Exits 1 when any output fails.
import { readFileSync } from 'node:fs';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const cases = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
let failed = 0;
for (const c of cases) {
  let value;
  try {
    value = JSON.parse(c.output);
  } catch (e) {
    console.log(`FAIL ${c.name}: not JSON: ${JSON.stringify(c.output)}`);
    failed++;
    continue;
  }
  const validate = ajv.compile(c.schema);
  if (!validate(value)) {
    console.log(`FAIL ${c.name}: ${JSON.stringify(c.output)}: ${ajv.errorsText(validate.errors)}`);
    failed++;
  }
}
console.log(`${cases.length - failed}/${cases.length} outputs valid`);
process.exit(failed ? 1 : 0);
