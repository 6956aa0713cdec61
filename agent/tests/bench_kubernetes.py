"""CPU cost of one Kubernetes identity refresh (PodResources List over the unix socket, the pod
log directories, the job records), and what that is in cores at the default refresh_s = 10.
The fake kubelet answers from this same process, so its serving cost is counted too: an upper
bound of the agent's own.

    .venv/bin/python -m agent.tests.bench_kubernetes [--pods 108] [--gpu-pods 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc

from agent.collectors import kubernetes_podresources_pb2_grpc as pb_grpc
from agent.collectors.kubernetes import KubernetesCollector
from agent.collectors.kubernetes_pods import PodDirectory, PodLogDirSource
from agent.tests.test_kubernetes import FakeKubelet, pod


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=108, help="pods on the node")
    parser.add_argument("--gpu-pods", type=int, default=8, help="of which hold a GPU each")
    parser.add_argument("--refreshes", type=int, default=200)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    sock, logs = root / "kubelet.sock", root / "pods"
    logs.mkdir()
    fake = FakeKubelet()
    for i in range(args.pods):
        gpu = i < args.gpu_pods
        resource = ("c", "nvidia.com/gpu", [f"GPU-{i}"]) if gpu else ("c", "cpu", ["0"])
        fake.pods.append(pod(f"p-{i}", "ml", resource))
        (logs / f"ml_p-{i}_{i:08x}-1111-2222-3333-444444444444").mkdir()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        directory = PodDirectory([PodLogDirSource(logs)], refresh_s=0)
        collector = KubernetesCollector(socket_path=sock, pods=directory, refresh_s=0)
        first = collector.collect(0.0)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for i in range(args.refreshes):
            collector.collect(float(i + 1))
        cpu = (time.process_time() - cpu0) / args.refreshes
        wall = (time.perf_counter() - wall0) / args.refreshes
        collector.close()
    finally:
        server.stop(None)
    print(
        f"{args.pods} pods ({args.gpu_pods} with a GPU; {len(first)} job records at first): "
        f"{cpu * 1e3:.2f} ms CPU, {wall * 1e3:.2f} ms wall per refresh; "
        f"{cpu / 10:.5f} cores at refresh_s = 10"
    )


if __name__ == "__main__":
    main()
