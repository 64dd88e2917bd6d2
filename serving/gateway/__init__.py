"""The KServe-protocol gateway both serving runtimes answer through: REST (app), gRPC (grpc_server), the drain
(drain), and the seam to what answers inference (backend)."""
