/**
 * ipwarden's own minimal subset of etcd's v3 gRPC API (package `etcdserverpb`: service `KV` with only
 * `Range` and `Txn`, service `Lease` with `LeaseGrant`, `LeaseRevoke`, `LeaseKeepAlive` for node
 * heartbeats, `Maintenance.Status` for the cluster-ID check of every endpoint and
 * `Auth.Authenticate` for user/password auth; only the fields ipwarden uses), as protobuf text the client parses at run
 * time — so the single-file bundle needs no `.proto` beside it (the `etcd3` npm client reads its
 * `proto/rpc.proto` from its package directory when loaded, which an installed plugin does not
 * have: docs/dependencies.md). Message names, field numbers and enum values are facts of the
 * public etcd API (etcd-io/etcd api/etcdserverpb/rpc.proto and api/mvccpb/kv.proto, v3.4; checked
 * against the copy shipped in the `etcd3` package). Fields not declared here are skipped on
 * decode, and a declared field left unset is sent as etcd's default.
 */

/** The protobuf text (proto3). */
export const ETCD_PROTO: string = `
syntax = "proto3";
package etcdserverpb;

service KV {
  rpc Range(RangeRequest) returns (RangeResponse) {}
  rpc Txn(TxnRequest) returns (TxnResponse) {}
}

service Maintenance {
  rpc Status(StatusRequest) returns (StatusResponse) {}
}

service Auth {
  rpc Authenticate(AuthenticateRequest) returns (AuthenticateResponse) {}
}

message StatusRequest {
}

message StatusResponse {
  ResponseHeader header = 1;
  string version = 2;
}

message AuthenticateRequest {
  string name = 1;
  string password = 2;
}

message AuthenticateResponse {
  ResponseHeader header = 1;
  string token = 2;
}

service Lease {
  rpc LeaseGrant(LeaseGrantRequest) returns (LeaseGrantResponse) {}
  rpc LeaseRevoke(LeaseRevokeRequest) returns (LeaseRevokeResponse) {}
  rpc LeaseKeepAlive(stream LeaseKeepAliveRequest) returns (stream LeaseKeepAliveResponse) {}
}

message LeaseGrantRequest {
  int64 TTL = 1;
  int64 ID = 2;
}

message LeaseGrantResponse {
  ResponseHeader header = 1;
  int64 ID = 2;
  int64 TTL = 3;
  string error = 4;
}

message LeaseRevokeRequest {
  int64 ID = 1;
}

message LeaseRevokeResponse {
  ResponseHeader header = 1;
}

message LeaseKeepAliveRequest {
  int64 ID = 1;
}

message LeaseKeepAliveResponse {
  ResponseHeader header = 1;
  int64 ID = 2;
  int64 TTL = 3;
}

message ResponseHeader {
  uint64 cluster_id = 1;
  uint64 member_id = 2;
  int64 revision = 3;
  uint64 raft_term = 4;
}

message KeyValue {
  bytes key = 1;
  int64 create_revision = 2;
  int64 mod_revision = 3;
  int64 version = 4;
  bytes value = 5;
  int64 lease = 6;
}

message RangeRequest {
  bytes key = 1;
  bytes range_end = 2;
  int64 limit = 3;
  int64 revision = 4;
  bool serializable = 7;
  bool keys_only = 8;
  bool count_only = 9;
}

message RangeResponse {
  ResponseHeader header = 1;
  repeated KeyValue kvs = 2;
  bool more = 3;
  int64 count = 4;
}

message PutRequest {
  bytes key = 1;
  bytes value = 2;
  int64 lease = 3;
  bool prev_kv = 4;
}

message PutResponse {
  ResponseHeader header = 1;
}

message DeleteRangeRequest {
  bytes key = 1;
  bytes range_end = 2;
  bool prev_kv = 3;
}

message DeleteRangeResponse {
  ResponseHeader header = 1;
  int64 deleted = 2;
}

message RequestOp {
  oneof request {
    RangeRequest request_range = 1;
    PutRequest request_put = 2;
    DeleteRangeRequest request_delete_range = 3;
  }
}

message ResponseOp {
  oneof response {
    RangeResponse response_range = 1;
    PutResponse response_put = 2;
    DeleteRangeResponse response_delete_range = 3;
  }
}

message Compare {
  enum CompareResult {
    Equal = 0;
    Greater = 1;
    Less = 2;
    NotEqual = 3;
  }
  enum CompareTarget {
    Version = 0;
    Create = 1;
    Mod = 2;
    Value = 3;
    Lease = 4;
  }
  CompareResult result = 1;
  CompareTarget target = 2;
  bytes key = 3;
  oneof target_union {
    int64 version = 4;
    int64 create_revision = 5;
    int64 mod_revision = 6;
    bytes value = 7;
    int64 lease = 8;
  }
  bytes range_end = 64;
}

message TxnRequest {
  repeated Compare compare = 1;
  repeated RequestOp success = 2;
  repeated RequestOp failure = 3;
}

message TxnResponse {
  ResponseHeader header = 1;
  bool succeeded = 2;
  repeated ResponseOp responses = 3;
}
`;
