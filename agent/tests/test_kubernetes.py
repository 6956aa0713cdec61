"""Kubernetes identity against a local fake kubelet: a real gRPC PodResources server on a unix
socket in tmp, a real HTTP server on loopback serving the PodList, the real identity collector
on a fake proc tree and the real identity join."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.collectors import kubernetes_podresources_pb2 as pb
from agent.collectors import kubernetes_podresources_pb2_grpc as pb_grpc
from agent.collectors.identity import IdentityCollector
from agent.collectors.kubernetes import KubernetesCollector
from agent.collectors.kubernetes_pods import (
    Owner,
    PodDirectory,
    PodInfo,
    PodListSource,
    PodLogDirSource,
    parse_pod_list,
)
from agent.collectors.nvml import GpuRef
from agent.commands.doctor import OFF, OK, UNAVAILABLE, check_kubernetes
from agent.config import parse_config
from agent.runtime import IdentityJoin
from agent.tests.test_identity import make_proc
from contract import signals
from contract.trace.records import check_record
from contract.wire.decode import batch_records
from contract.wire.encode import BatchBuilder

NODE = "gpu-node-07"
UID_A = "7d1c5e0a-1111-4222-8333-444455556666"
UID_B = "9e2d6f1b-aaaa-4bbb-8ccc-dddd00001111"
JOB_UID = "c0ffee00-1234-4567-89ab-cdef01234567"
POD_CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID_A.replace('-', '_')}.slice/cri-containerd-abc.scope\n"
)


class FakeKubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The kubelet's PodResources service, answering what the test sets."""

    def __init__(self) -> None:
        self.pods: list[pb.PodResources] = []
        self.allocatable = [
            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-aaaa", "GPU-bbbb"])
        ]
        self.calls: list[str] = []

    def List(self, request: Any, context: Any) -> Any:
        self.calls.append("List")
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        self.calls.append("GetAllocatableResources")
        return pb.AllocatableResourcesResponse(devices=self.allocatable, cpu_ids=[0, 1])


def pod(name: str, ns: str, *containers: tuple[str, str, list[str]]) -> Any:
    return pb.PodResources(
        name=name,
        namespace=ns,
        containers=[
            pb.ContainerResources(
                name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)]
            )
            for c, r, ids in containers
        ],
    )


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[FakeKubelet, Path]]:
    sock = tmp_path / "pod-resources" / "kubelet.sock"
    sock.parent.mkdir()
    fake = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        yield fake, sock
    finally:
        server.stop(None)


def pod_item(
    name: str, uid: str, *, labels: dict[str, str], owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": uid, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "spec": {"nodeName": NODE}}


PYTORCHJOB_PODS = {
    "kind": "PodList",
    "items": [
        pod_item(
            "llama-worker-0",
            UID_A,
            labels={
                "training.kubeflow.org/job-name": "llama",
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": "0",
            },
            owner={"kind": "PyTorchJob", "name": "llama", "uid": JOB_UID, "controller": True},
        ),
        pod_item(
            "llama-worker-1",
            UID_B,
            labels={"training.kubeflow.org/job-name": "llama"},
            owner={"kind": "PyTorchJob", "name": "llama", "uid": JOB_UID, "controller": True},
        ),
    ],
}
LLAMA_JOB = "k8s-ml-pytorchjob-llama-c0ffee00"


@pytest.fixture
def pod_list() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A loopback HTTP server answering the PodList; the headers of each request."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({**self.headers, "path": self.path})
            body = json.dumps(PYTORCHJOB_PODS).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield (
            f"http://127.0.0.1:{server.server_port}/api/v1/pods?fieldSelector=spec.nodeName={NODE}",
            seen,
        )
    finally:
        server.shutdown()
        server.server_close()


def test_gpus_mapped_to_the_owner_job_from_podresources_and_the_pod_list(
    kubelet: tuple[FakeKubelet, Path], pod_list: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    fake, sock = kubelet
    url, seen = pod_list
    token = tmp_path / "token"
    token.write_text("sa-token-1\n")
    fake.pods = [
        pod("llama-worker-0", "ml", ("trainer", "nvidia.com/gpu", ["GPU-aaaa"])),
        pod("llama-worker-1", "ml", ("trainer", "nvidia.com/gpu", ["GPU-bbbb"])),
        pod("web", "default"),  # no devices: not a GPU pod
    ]
    directory = PodDirectory([PodListSource(url, token_file=token)])
    collector = KubernetesCollector(socket_path=sock, pods=directory, refresh_s=10)
    records = collector.collect(100.0)
    assert fake.calls[:2] == ["GetAllocatableResources", "List"]
    assert collector.allocatable == ["GPU-aaaa", "GPU-bbbb"]
    assert seen[0]["Authorization"] == "Bearer sa-token-1"
    assert "fieldSelector=spec.nodeName=gpu-node-07" in seen[0]["path"]
    # Both pods of the PyTorchJob are one job: one record, both GPUs.
    assert len(records) == 1
    rec = records[0]
    assert check_record(rec) is None
    assert rec["job"] == LLAMA_JOB
    assert rec["scheduler"] == "kubernetes"
    assert rec["k8s_namespace"] == "ml"
    assert rec["allocation"] == {"gpus": ["GPU-aaaa", "GPU-bbbb"], "gpu_indices": []}
    assert rec["config"] == {"k8s_namespace": "ml", "k8s_owner": "pytorchjob/llama"}
    assert collector.gpu_jobs() == {"GPU-aaaa": LLAMA_JOB, "GPU-bbbb": LLAMA_JOB}
    # Within refresh_s nothing is asked again; after it, unchanged GPUs say nothing.
    assert collector.collect(105.0) == []
    assert fake.calls.count("List") == 1
    assert collector.collect(111.0) == []
    # Worker 1 gone: the job keeps GPU-aaaa; then worker 0 gone: the allocation ends.
    fake.pods = fake.pods[:1]
    [shrunk] = collector.collect(122.0)
    assert shrunk["allocation"]["gpus"] == ["GPU-aaaa"]
    fake.pods = []
    [ended] = collector.collect(133.0)
    assert ended["job"] == LLAMA_JOB
    assert ended["allocation"] == {"gpus": [], "gpu_indices": []}
    collector.close()


def test_index_device_ids_and_mig_resources(kubelet: tuple[FakeKubelet, Path]) -> None:
    fake, sock = kubelet
    fake.pods = [
        pod("a", "team", ("c", "nvidia.com/gpu", ["1"])),
        pod("b", "team", ("c", "nvidia.com/mig-1g.10gb", ["MIG-1234"])),
        pod("c", "team", ("c", "example.com/fpga", ["fpga0"])),
    ]
    collector = KubernetesCollector(
        socket_path=sock, gpu_uuid={1: "GPU-bbbb"}.get, pods=PodDirectory([])
    )
    records = {r["job"]: r["allocation"] for r in collector.collect(1.0)}
    # No pod metadata source answered: each pod is its own job, by name.
    assert records == {
        "k8s-team-pod-a": {"gpus": ["GPU-bbbb"], "gpu_indices": []},
        "k8s-team-pod-b": {"gpus": ["MIG-1234"], "gpu_indices": []},
    }


def test_missing_socket_logs_once_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = tmp_path / "kubelet.sock"
    collector = KubernetesCollector(socket_path=sock, pods=PodDirectory([]), refresh_s=0)
    with caplog.at_level(logging.INFO, logger="agent.collectors.kubernetes"):
        assert collector.collect(1.0) == []
        assert collector.collect(2.0) == []
    said = [r for r in caplog.records if "kubernetes identity unavailable" in r.message]
    assert len(said) == 1
    assert str(sock) in said[0].message
    assert said[0].levelno == logging.INFO  # no kubelet is what a Slurm node looks like
    assert not collector.available
    # The kubelet comes up at that path: the next collect reads it.
    fake = FakeKubelet()
    fake.pods = [pod("p", "ns", ("c", "nvidia.com/gpu", ["GPU-aaaa"]))]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    pb_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        [rec] = collector.collect(3.0)
        assert rec["job"] == "k8s-ns-pod-p"
        assert collector.available
    finally:
        server.stop(None)
        collector.close()


def test_a_socket_that_does_not_answer_is_unavailable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sock = tmp_path / "kubelet.sock"
    sock.write_text("")  # a path that exists, with no server behind it
    collector = KubernetesCollector(socket_path=sock, pods=PodDirectory([]), timeout_s=0.5)
    with caplog.at_level(logging.WARNING):
        assert collector.collect(1.0) == []
    assert any(
        "PodResources at" in r.message and r.levelno == logging.WARNING for r in caplog.records
    )


def test_pod_list_unreachable_falls_back_to_pod_log_directories(
    kubelet: tuple[FakeKubelet, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake, sock = kubelet
    logs = tmp_path / "log-pods"
    (logs / f"ml_llama-worker-0_{UID_A}").mkdir(parents=True)
    (logs / "not-a-pod-dir").mkdir()
    fake.pods = [pod("llama-worker-0", "ml", ("trainer", "nvidia.com/gpu", ["GPU-aaaa"]))]
    dead = PodListSource("http://127.0.0.1:9/pods", timeout_s=0.5)  # discard port: refused
    directory = PodDirectory([dead, PodLogDirSource(logs)])
    collector = KubernetesCollector(socket_path=sock, pods=directory)
    with caplog.at_level(logging.WARNING):
        [rec] = collector.collect(1.0)
    assert directory.source_used == "pod log directories"
    assert any("kubernetes pod list unavailable" in r.message for r in caplog.records)
    # No labels or owner: the pod is its own job, with its uid.
    assert rec["job"] == "k8s-ml-pod-llama-worker-0-7d1c5e0a"
    collector.close()


def test_process_in_a_pod_takes_the_owner_job_and_container(
    kubelet: tuple[FakeKubelet, Path], pod_list: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    fake, sock = kubelet
    url, _seen = pod_list
    fake.pods = [pod("llama-worker-0", "ml", ("trainer", "nvidia.com/gpu", ["GPU-aaaa"]))]
    kube = KubernetesCollector(socket_path=sock, pods=PodDirectory([PodListSource(url)]))
    proc = tmp_path / "proc"
    make_proc(
        proc,
        4100,
        {"RANK": "0", "WORLD_SIZE": "2", "KUBERNETES_SERVICE_HOST": "10.0.0.1"},
        cgroup=POD_CGROUP,
    )
    gpu = GpuRef("GPU-aaaa", 0)
    identity = IdentityCollector(
        node=NODE, proc_root=proc, gpu_pids=lambda: {4100: [gpu]}, pods=kube.lookup
    )
    records = kube.collect(1.0) + identity.collect(1.0)
    process = next(r for r in records if r["type"] == "process")
    assert process["job"] == LLAMA_JOB
    assert process["rank"] == 0
    labels = process["labels"]
    assert labels["k8s_namespace"] == "ml"
    assert labels["k8s_pod"] == "llama-worker-0"
    assert labels["k8s_container"] == "trainer"
    assert labels["k8s_owner"] == "pytorchjob/llama"
    assert labels["k8s_replica_type"] == "worker"
    assert labels["scheduler"] == "kubernetes"
    job = next(r for r in records if r["type"] == "job" and "allocation" not in r)
    assert job["job"] == LLAMA_JOB
    kube.close()


def test_join_keys_an_idle_allocated_gpu_and_processes_win() -> None:
    join = IdentityJoin(NODE)
    join.apply(
        [
            {
                "type": "job",
                "ts": 1.0,
                "job": LLAMA_JOB,
                "allocation": {"gpus": ["GPU-aaaa"], "gpu_indices": [1]},
            }
        ]
    )
    join.learn_gpu("GPU-bbbb", 1)
    idle = [
        {"type": "sample", "ts": 2.0, "name": "gpu.util", "value": 0.0, "gpu": "GPU-aaaa"},
        {"type": "sample", "ts": 2.0, "name": "gpu.util", "value": 0.0, "gpu_index": 1},
        {"type": "sample", "ts": 2.0, "name": "gpu.util", "value": 0.0, "gpu": "GPU-cccc"},
    ]
    join.apply(idle)
    assert [r.get(signals.JOB) for r in idle] == [LLAMA_JOB, LLAMA_JOB, None]
    assert idle[1][signals.GPU] == "GPU-bbbb"
    # A process of another job on GPU-aaaa: the process's job wins over the allocation.
    join.apply(
        [{"type": "process", "ts": 3.0, "node": NODE, "pid": 7, "job": "other", "gpu": "GPU-aaaa"}]
    )
    s = {"type": "sample", "ts": 4.0, "name": "gpu.util", "value": 1.0, "gpu": "GPU-aaaa"}
    join.apply([s])
    assert s[signals.JOB] == "other"
    # The allocation ends: GPU-bbbb is no longer the job's.
    join.apply([{"type": "job", "ts": 5.0, "job": LLAMA_JOB, "allocation": {"gpus": []}}])
    s2 = {"type": "sample", "ts": 6.0, "name": "gpu.util", "value": 0.0, "gpu_index": 1}
    join.apply([s2])
    assert signals.JOB not in s2
    assert join.allocations() == {}


def test_two_jobs_claiming_one_gpu_leave_it_unkeyed() -> None:
    join = IdentityJoin(NODE)
    join.apply(
        [
            {"type": "job", "ts": 1.0, "job": "a", "allocation": {"gpus": ["GPU-aaaa"]}},
            {"type": "job", "ts": 1.0, "job": "b", "allocation": {"gpus": ["GPU-aaaa"]}},
        ]
    )
    s = {"type": "sample", "ts": 2.0, "name": "gpu.util", "value": 0.0, "gpu": "GPU-aaaa"}
    join.apply([s])
    assert signals.JOB not in s


def info(labels: dict[str, str], *owners: Owner, name: str = "p-0") -> PodInfo:
    return PodInfo(uid=UID_A, namespace="ml", name=name, labels=labels, owners=owners)


def test_owner_to_job_id_rules() -> None:
    # batch Job: its name and controller uid, the same for every pod of the Job.
    job = info(
        {"batch.kubernetes.io/job-name": "bert", "batch.kubernetes.io/controller-uid": JOB_UID},
        Owner("job", "bert", JOB_UID),
    )
    assert job.job_id() == "k8s-ml-job-bert-c0ffee00"
    # A JobSet's pods carry batch Job labels too: the JobSet wins.
    jobset = info(
        {
            "jobset.sigs.k8s.io/jobset-name": "big",
            "jobset.sigs.k8s.io/jobset-uid": UID_B,
            "batch.kubernetes.io/job-name": "big-workers-0",
        },
        Owner("job", "big-workers-0", JOB_UID),
    )
    assert jobset.job_id() == "k8s-ml-jobset-big-9e2d6f1b"
    # RayCluster pods: the cluster, the reference's uid.
    ray = info({"ray.io/cluster": "rc"}, Owner("raycluster", "rc", UID_B))
    assert ray.job_id() == "k8s-ml-raycluster-rc-9e2d6f1b"
    # A Deployment's pods, across rollouts: no ReplicaSet hash, no uid.
    deploy = info({"pod-template-hash": "5d8f7c"}, Owner("replicaset", "vllm-5d8f7c", UID_B))
    assert deploy.job_id() == "k8s-ml-deployment-vllm"
    # An operator's own id wins; a bare pod is its own job.
    assert info({"proof.dev/job": "run-42"}).job_id() == "run-42"
    assert info({}).job_id() == "k8s-ml-pod-p-0-7d1c5e0a"
    assert len(info({}, Owner("job", "x" * 300, JOB_UID)).job_id()) <= 200


def test_pod_list_items_without_metadata_are_skipped_alone() -> None:
    pods = parse_pod_list(
        {"items": [{"spec": {}}, {"metadata": {"name": "n"}}, PYTORCHJOB_PODS["items"][0]]}
    )
    assert [p.name for p in pods] == ["llama-worker-0"]
    assert pods[0].owners == (Owner("pytorchjob", "llama", JOB_UID),)
    with pytest.raises(ValueError, match="not a PodList"):
        parse_pod_list({"kind": "Status"})


def test_committed_podresources_stubs_are_what_gen_proto_writes(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        ["bash", str(root / "scripts" / "gen-proto.sh"), str(tmp_path)],
        check=True,
        cwd=root,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    for name in ("kubernetes_podresources_pb2.py", "kubernetes_podresources_pb2_grpc.py"):
        committed = (root / "agent" / "collectors" / name).read_bytes()
        assert (tmp_path / name).read_bytes() == committed, f"{name} is stale: run gen-proto.sh"


def test_doctor_reports_podresources_and_the_pod_source(
    kubelet: tuple[FakeKubelet, Path], tmp_path: Path
) -> None:
    fake, sock = kubelet
    fake.pods = [pod("p", "ns", ("c", "nvidia.com/gpu", ["GPU-aaaa"]))]
    logs = tmp_path / "logs"
    (logs / f"ns_p_{UID_A}").mkdir(parents=True)
    cfg = parse_config(
        {"kubernetes": {"pod_resources_socket": str(sock), "pod_log_dir": str(logs)}}, env={}
    )
    check = check_kubernetes(cfg, timeout=2)
    assert check.status == OK
    assert "2 allocatable GPU(s), 1 container(s) holding GPUs" in check.detail
    assert "pod log directories" in check.detail
    missing = parse_config({"kubernetes": {"pod_resources_socket": str(tmp_path / "no")}}, env={})
    assert check_kubernetes(missing, timeout=2).status == UNAVAILABLE
    off = parse_config({"kubernetes": {"enabled": False}}, env={})
    assert check_kubernetes(off, timeout=2).status == OFF


def test_importing_the_collectors_loads_no_grpc() -> None:
    # `proof-agent exec` imports agent.collectors for every job command: gRPC (~20 MiB) must
    # wait until a kubelet is actually asked.
    code = "import sys, agent.commands.exec; print('grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_pods_force_a_pod_list_read_at_most_every_two_seconds(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    clock = [100.0]
    directory = PodDirectory([PodLogDirSource(logs)], monotonic=lambda: clock[0])
    collector = KubernetesCollector(socket_path=tmp_path / "none.sock", pods=directory)
    for _ in range(50):  # fifty new processes of a pod nobody lists yet
        assert collector.lookup(UID_B) is None
    assert directory.reads == 1
    (logs / f"ml_new-pod_{UID_B}").mkdir()
    clock[0] += 2.5
    found = collector.lookup(UID_B)
    assert found is not None and found.job == "k8s-ml-pod-new-pod-9e2d6f1b"
    assert directory.reads == 2


def test_allocation_stays_on_the_node_and_the_rest_goes_on_the_wire() -> None:
    builder = BatchBuilder("agent-1")
    builder.add(
        {
            "type": "job",
            "ts": 1.0,
            "job": LLAMA_JOB,
            "scheduler": "kubernetes",
            "state": "running",
            "k8s_namespace": "ml",
            "allocation": {"gpus": ["GPU-aaaa"], "gpu_indices": []},
            "config": {"k8s_namespace": "ml", "k8s_owner": "pytorchjob/llama"},
        }
    )
    [sent] = batch_records(builder.build(1))
    assert "allocation" not in sent
    assert sent["k8s_namespace"] == "ml"  # a job attribute: ingest maps it to a customer
    assert sent["config"]["k8s_owner"] == "pytorchjob/llama"
