#!/bin/sh
TOKIO_WORKER_THREADS=1 exec /tmp/ipsan-base "$@"
