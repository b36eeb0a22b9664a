// A gradcheck client for Node.js from the .proto files alone (proto/ at the repository root):
// @grpc/grpc-js and @grpc/proto-loader, no generated code.
//
// Node attributes are a google.protobuf.Struct. protobufjs (under proto-loader) encodes a Struct
// like any message: its one field is `fields`, a map of google.protobuf.Value, each a oneof
// (nullValue, numberValue, stringValue, boolValue, structValue, listValue). A plain object such as
// `attrs: {axis: 0}` has no `fields` key, so it is sent as an EMPTY Struct -- no error, and the server
// verifies the op with its defaults (`sum` over every axis). Only the protobuf JSON mapping (what
// Python's json_format and `gradcheck-svc verify graph.json` read) writes a Struct as a plain object.
// toStruct() below builds the binary form; the report's `attributes` says what each node was
// verified with, so a lost attribute shows.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const protobuf = require("protobufjs");

const PROTO_ROOT = path.resolve(__dirname, "..", "..", "proto");
// keepCase: the proto's own field names (requires_grad, not requiresGrad); oneofs: a Value's `kind`
// names the member that is set
const LOADER_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: false, oneofs: true };

// The member names are camelCase (numberValue, listValue) whatever keepCase says: protobufjs bundles
// google/protobuf/struct.proto's types in that spelling rather than parsing the file.

/** A google.protobuf.Value for a JSON value (numbers are doubles, as in JSON). */
function toValue(v) {
  if (v === null || v === undefined) return { nullValue: "NULL_VALUE" };
  if (typeof v === "number") return { numberValue: v };
  if (typeof v === "string") return { stringValue: v };
  if (typeof v === "boolean") return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  if (typeof v === "object") return { structValue: toStruct(v) };
  throw new TypeError(`attribute value of type ${typeof v} has no JSON form`);
}

/** A google.protobuf.Struct message for a plain object: {axis: 0} -> {fields: {axis: {numberValue: 0}}}. */
function toStruct(obj) {
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
    throw new TypeError("attributes must be a plain object");
  }
  const fields = {};
  for (const [key, value] of Object.entries(obj)) fields[key] = toValue(value);
  return { fields };
}

/** The JSON value of a decoded google.protobuf.Value (loaded with oneofs: true). */
function fromValue(v) {
  switch (v.kind) {
    case "nullValue": return null;
    case "numberValue": return v.numberValue;
    case "stringValue": return v.stringValue;
    case "boolValue": return v.boolValue;
    case "listValue": return (v.listValue.values || []).map(fromValue);
    case "structValue": return fromStruct(v.structValue);
    default: return undefined;
  }
}

/** A plain object for a decoded google.protobuf.Struct. */
function fromStruct(s) {
  const out = {};
  for (const [key, value] of Object.entries((s && s.fields) || {})) out[key] = fromValue(value);
  return out;
}

/** A GradCheckService client for `target` (host:port), without TLS. */
function connect(target) {
  const definition = protoLoader.loadSync("gradcheck/v1/service.proto", { ...LOADER_OPTIONS, includeDirs: [PROTO_ROOT] });
  const { GradCheckService } = grpc.loadPackageDefinition(definition).gradcheck.v1;
  return new GradCheckService(target, grpc.credentials.createInsecure());
}

/** Verify(request) as a Promise of the response. */
function verify(client, request, deadlineSeconds = 120) {
  const deadline = new Date(Date.now() + deadlineSeconds * 1000);
  return new Promise((resolve, reject) => {
    client.Verify(request, { deadline }, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

let richTypes = null;

/** The rich error details of a failed call: {code, message, violations: [{field, description}]}
 * from its `grpc-status-details-bin` trailer (google.rpc.Status holding google.rpc.BadRequest, whose
 * .proto files the repository ships in proto/google/rpc/); null when the trailer is absent. */
function richError(err) {
  const [bin] = (err.metadata && err.metadata.get("grpc-status-details-bin")) || [];
  if (!bin) return null;
  if (richTypes === null) {
    const root = new protobuf.Root();
    root.resolvePath = (origin, target) => path.join(PROTO_ROOT, target);
    root.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
    richTypes = { Status: root.lookupType("google.rpc.Status"), BadRequest: root.lookupType("google.rpc.BadRequest") };
  }
  const status = richTypes.Status.decode(bin);
  const violations = [];
  for (const any of status.details || []) {
    if (any.type_url === "type.googleapis.com/google.rpc.BadRequest") {
      for (const v of richTypes.BadRequest.decode(any.value).field_violations || []) {
        violations.push({ field: v.field, description: v.description });
      }
    }
  }
  return { code: status.code, message: status.message, violations };
}

/** The report's attributes (one entry per distinct op, used, defaulted, with its nodes) as
 * {node: {op, used, defaulted}}. */
function attributesByNode(report) {
  const out = {};
  for (const a of report.attributes || []) {
    const entry = { op: a.op, used: fromStruct(a.used), defaulted: a.defaulted || [] };
    for (const node of a.nodes || []) out[node] = entry;
  }
  return out;
}

module.exports = { toStruct, toValue, fromStruct, fromValue, connect, verify, richError, attributesByNode, PROTO_ROOT };
