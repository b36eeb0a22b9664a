"""The gRPC front end: a thin grpc.aio servicer over a pool of worker processes.

Modules: config (limits and settings), accounting (each request's one log
line and metric), tasks (a stream's bounded task group), status (the one
GradcheckError -> gRPC status mapping), pool (worker processes), worker (what
a worker process runs: request message -> response message over the one
pipeline, gradcheck_svc/request.py), servicer, auth, metrics, main
(`gradcheck-svc serve`), launcher (start a server as a child process).
"""
