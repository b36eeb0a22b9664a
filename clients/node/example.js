// gradcheck from Node.js: `node example.js HOST:PORT` against a running `gradcheck-svc serve`.
//
// The graph is L = sum(square(sum(x, axis=0))) for x = [[1, 2, 3], [4, 5, 6]]: the column sums are
// 5, 7, 9, so L = 155 and dL/dx = 2 * (5, 7, 9) in each row. It is sent three ways:
//   1. attrs as a plain object {axis: 0}: protobufjs sends an empty Struct, the server verifies a sum
//      over everything (L = 21^2 = 441) -- and the report's `attributes` shows axis null, defaulted;
//   2. attrs built with toStruct({axis: 0}): L = 155, verified PASS, the report shows axis 0;
//   3. an attribute sum does not have (toStruct({axes: 0})): INVALID_ARGUMENT, whose rich details
//      (google.rpc.BadRequest) name the node (field "node 's'").
// Each step checks what it must see and the script exits 1 at the first surprise; it prints one JSON
// line per step (tests/test_node_client.py reads them).
"use strict";

const assert = require("assert");
const grpc = require("@grpc/grpc-js");
const gc = require("./gradcheck");

function request(id, attrs) {
  return {
    id,
    graph: {
      name: `column_sums_${id}`,
      inputs: [{ name: "x", value: { dtype: "float64", shape: [2, 3], data: [1, 2, 3, 4, 5, 6] }, requires_grad: true }],
      nodes: [
        { name: "s", op: "sum", inputs: ["x"], attrs },
        { name: "sq", op: "square", inputs: ["s"] },
        { name: "L", op: "sum", inputs: ["sq"] },
      ],
      output: "L",
    },
  };
}

async function main(target) {
  const client = gc.connect(target);
  try {
    const lost = (await gc.verify(client, request("plain_object", { axis: 0 }))).report;
    const lostAttrs = gc.attributesByNode(lost).s;
    assert.strictEqual(lost.loss, 441, "a plain object is an empty Struct: the sum runs over every axis");
    assert.deepStrictEqual(lostAttrs.used, { axis: null, keepdims: false });
    assert.deepStrictEqual(lostAttrs.defaulted, ["axis", "keepdims"]);
    console.log(JSON.stringify({ step: "plain_object", loss: lost.loss, verdict: lost.verdict, s: lostAttrs }));

    const right = (await gc.verify(client, request("struct", gc.toStruct({ axis: 0 })))).report;
    const rightAttrs = gc.attributesByNode(right).s;
    assert.strictEqual(right.loss, 155);
    assert.strictEqual(right.verdict, "pass");
    assert.deepStrictEqual(rightAttrs.used, { axis: 0, keepdims: false });
    assert.deepStrictEqual(rightAttrs.defaulted, ["keepdims"]);
    const [x] = right.parameters;
    assert.deepStrictEqual(x.gradient, [10, 14, 18, 10, 14, 18]);
    console.log(JSON.stringify({ step: "struct", loss: right.loss, verdict: right.verdict, s: rightAttrs, gradient: x.gradient }));

    try {
      await gc.verify(client, request("unknown_attribute", gc.toStruct({ axes: 0 })));
      assert.fail("an attribute the op does not have must be refused");
    } catch (err) {
      if (err instanceof assert.AssertionError) throw err;
      assert.strictEqual(err.code, grpc.status.INVALID_ARGUMENT);
      const rich = gc.richError(err);
      assert.ok(rich, "the error carries google.rpc.Status details");
      assert.strictEqual(rich.violations.length, 1);
      assert.strictEqual(rich.violations[0].field, "node 's'");
      assert.match(rich.violations[0].description, /unknown attribute 'axes'/);
      console.log(JSON.stringify({ step: "unknown_attribute", code: "INVALID_ARGUMENT", status: rich }));
    }
  } finally {
    client.close();
  }
}

const target = process.argv[2] || process.env.GRADCHECK_TARGET || "localhost:50051";
main(target).catch((err) => {
  console.error(`example failed: ${err.message}`);
  process.exit(1);
});
