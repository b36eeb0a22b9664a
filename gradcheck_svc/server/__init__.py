"""The gRPC front end: a thin grpc.aio servicer over a pool of worker processes.

Modules: config (limits and settings), execute (request message -> report
message; pure, no gRPC, also used in-process by the client's CI command),
status (the one GradcheckError -> gRPC status mapping), pool (worker
processes), worker (what a worker process runs), servicer, auth, metrics,
main (`gradcheck-svc serve`), launcher (start a server as a child process).
"""
