"""specray's gRPC API: ``specray.proto`` and its generated Python stubs (``specray_pb2``,
``specray_pb2_grpc``), committed so that serving needs no protoc; regenerate them with
``python -m deployments.protos.generate`` after editing the proto."""
