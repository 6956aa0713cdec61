"""Generated gRPC/protobuf code for proto/ingest.proto (scripts/gen-proto.sh). Do not edit the
*_pb2* modules by hand: change the .proto and regenerate."""
