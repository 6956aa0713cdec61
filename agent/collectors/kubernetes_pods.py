"""Kubernetes pod metadata for identity: pod uid → namespace, name, labels, owner → Proof job id.

The PodResources API (agent/collectors/kubernetes.py) says which container holds which GPU but
not the pod's labels or owner, and a distributed job is many pods on many nodes: its job id must
come from what they share (their owner), not from one pod. Two sources, neither needing
cluster-admin (docs/agent.md, "Kubernetes identity"):

- `PodListSource`: a JSON PodList over HTTP(S) — the API server's
  `/api/v1/pods?fieldSelector=spec.nodeName=<node>` with the DaemonSet's service-account token
  (RBAC: get/list on pods, nothing else; the Helm chart's ClusterRole), or the kubelet's
  read-only `http://127.0.0.1:10255/pods` where a cluster still enables it. Labels and
  ownerReferences, so the job id is the owner's.
- `PodLogDirSource`: the kubelet's `/var/log/pods/<namespace>_<name>_<uid>/` directories, on
  every node, readable by root with no API access: namespace, name and uid, no labels; each pod
  is then its own job.

Which job id (first that applies): the pod's `proof.dev/job` label or annotation as it is; a
group label (JobSet, Kubeflow training job, RayCluster, Volcano job, LeaderWorkerSet, batch
Job); the controlling ownerReference (a ReplicaSet counts as its Deployment); the pod itself.
The id is `k8s-<namespace>-<kind>-<name>[-<uid head>]`, the same on every node for the pods of
one owner, and a re-created owner of the same name (another uid) is another job.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.collectors.identity import bounded_job_id

log = logging.getLogger(__name__)

# A pod label or annotation that names the Proof job outright (operators with their own ids).
JOB_LABEL = "proof.dev/job"
# Group labels, most specific first: (label holding the group name, its kind, label holding the
# group's uid or None). A JobSet's pods also carry the batch Job labels, a Kubeflow job's the
# operator's: the first that is present wins.
GROUP_LABELS: tuple[tuple[str, str, str | None], ...] = (
    ("jobset.sigs.k8s.io/jobset-name", "jobset", "jobset.sigs.k8s.io/jobset-uid"),
    ("training.kubeflow.org/job-name", "kubeflow", None),
    ("ray.io/cluster", "raycluster", None),
    ("volcano.sh/job-name", "vcjob", None),
    ("leaderworkerset.sigs.k8s.io/name", "leaderworkerset", None),
    ("batch.kubernetes.io/job-name", "job", "batch.kubernetes.io/controller-uid"),
    ("job-name", "job", "controller-uid"),
)
# Labels copied onto the pod's process records (k8s_<short name>), for filters in the console.
COPIED_LABELS = {
    "app.kubernetes.io/name": "k8s_app",
    "training.kubeflow.org/replica-type": "k8s_replica_type",
    "training.kubeflow.org/replica-index": "k8s_replica_index",
    "ray.io/node-type": "k8s_ray_node_type",
}
_UID_HEAD = 8


@dataclass(frozen=True)
class Owner:
    kind: str  # lower case: job, pytorchjob, raycluster, deployment, pod, …
    name: str
    uid: str | None = None


@dataclass(frozen=True)
class PodInfo:
    """What identity needs of one pod."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owners: tuple[Owner, ...] = ()  # controller ownerReference first

    def owner(self) -> Owner:
        """The owner whose id the pod's job takes (module docstring)."""
        controller = self.owners[0] if self.owners else None
        for label, kind, uid_label in GROUP_LABELS:
            name = self.labels.get(label)
            if not name:
                continue
            uid = self.labels.get(uid_label) if uid_label else None
            if controller is not None and controller.name == name:
                # The operator's own kind (pytorchjob, mpijob, …) and uid, from the reference.
                return Owner(controller.kind, name, uid or controller.uid)
            return Owner(kind, name, uid)
        if controller is not None:
            if controller.kind == "replicaset" and self.labels.get("pod-template-hash"):
                suffix = "-" + self.labels["pod-template-hash"]
                if controller.name.endswith(suffix):
                    # One Deployment across its rollouts: no uid (each ReplicaSet has its own).
                    return Owner("deployment", controller.name[: -len(suffix)])
            return controller
        return Owner("pod", self.name, self.uid)

    def job_id(self) -> str:
        explicit = (self.labels.get(JOB_LABEL) or self.annotations.get(JOB_LABEL) or "").strip()
        if explicit:
            return bounded_job_id(explicit)
        owner = self.owner()
        out = f"k8s-{self.namespace}-{owner.kind}-{owner.name}"
        if owner.uid:
            out += "-" + owner.uid.replace("-", "")[:_UID_HEAD]
        return bounded_job_id(out)

    def process_labels(self, container: str | None = None) -> dict[str, str]:
        """Labels for the records of this pod's processes."""
        out = {"k8s_namespace": self.namespace, "k8s_pod": self.name, "k8s_pod_uid": self.uid}
        owner = self.owner()
        out["k8s_owner"] = f"{owner.kind}/{owner.name}"
        if container:
            out["k8s_container"] = container
        for label, short in COPIED_LABELS.items():
            if self.labels.get(label):
                out[short] = self.labels[label]
        return out


class PodSource(Protocol):
    """Where pod metadata comes from; `pods()` raises OSError/ValueError when it cannot say."""

    name: str

    def pods(self) -> list[PodInfo]: ...


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(v, str)}


def parse_pod_list(doc: Any) -> list[PodInfo]:
    """A PodList JSON document (API server or kubelet `/pods`) → pods; an item without a uid,
    name or namespace is skipped alone (and logged), the rest kept."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise ValueError("not a PodList: no 'items' list")
    out: list[PodInfo] = []
    for number, item in enumerate(doc["items"]):
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            log.warning("pod list item %d has no metadata; skipped", number)
            continue
        uid, name, ns = meta.get("uid"), meta.get("name"), meta.get("namespace")
        if not (isinstance(uid, str) and isinstance(name, str) and isinstance(ns, str)):
            log.warning("pod list item %d lacks uid/name/namespace; skipped", number)
            continue
        owners: list[Owner] = []
        for ref in meta.get("ownerReferences") or ():
            if not isinstance(ref, dict) or not ref.get("kind") or not ref.get("name"):
                continue
            owner = Owner(str(ref["kind"]).lower(), str(ref["name"]), ref.get("uid") or None)
            if ref.get("controller"):
                owners.insert(0, owner)
            else:
                owners.append(owner)
        out.append(
            PodInfo(
                uid=uid,
                namespace=ns,
                name=name,
                labels=_str_map(meta.get("labels")),
                annotations=_str_map(meta.get("annotations")),
                owners=tuple(owners),
            )
        )
    return out


Fetch = Callable[[str, Mapping[str, str], ssl.SSLContext | None, float], bytes]


def _urlopen(
    url: str, headers: Mapping[str, str], context: ssl.SSLContext | None, timeout: float
) -> bytes:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"pod list URL must be http:// or https://, got {url!r}")
    request = urllib.request.Request(url, headers=dict(headers))  # noqa: S310 - scheme checked above
    with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:  # noqa: S310 - scheme checked above
        body: bytes = resp.read(64 * 1024 * 1024)
        return body


class PodListSource:
    """A PodList over HTTP(S). `token_file` (a bearer token, re-read every call: projected
    service-account tokens rotate) and `ca_file` are paths; both optional."""

    name = "pod list"

    def __init__(
        self,
        url: str,
        *,
        token_file: str | Path | None = None,
        ca_file: str | Path | None = None,
        timeout_s: float = 5.0,
        fetch: Fetch = _urlopen,
    ) -> None:
        self.url = url
        self.token_file = Path(token_file) if token_file else None
        self.ca_file = Path(ca_file) if ca_file else None
        self.timeout_s = timeout_s
        self.fetch = fetch

    def pods(self) -> list[PodInfo]:
        headers = {"Accept": "application/json"}
        if self.token_file is not None:
            headers["Authorization"] = "Bearer " + self.token_file.read_text().strip()
        context = None
        if self.url.startswith("https://"):
            context = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file is not None else None
            )
        return parse_pod_list(json.loads(self.fetch(self.url, headers, context, self.timeout_s)))


class PodLogDirSource:
    """Pods from the kubelet's log directories, `<root>/<namespace>_<name>_<uid>/`: no labels
    or owners (each pod is its own job), but no API access either."""

    name = "pod log directories"

    def __init__(self, root: str | Path = "/var/log/pods") -> None:
        self.root = Path(root)

    def pods(self) -> list[PodInfo]:
        out = []
        for entry in sorted(self.root.iterdir()):
            parts = entry.name.split("_")
            # Namespaces and pod names are DNS labels/subdomains (no '_'); uids are UUIDs.
            if len(parts) != 3 or not all(parts) or not entry.is_dir():
                continue
            ns, name, uid = parts
            out.append(PodInfo(uid=uid, namespace=ns, name=name))
        return out


class PodDirectory:
    """Pod uid → PodInfo and (namespace, name) → PodInfo, from the first source that answers,
    refreshed at most every `refresh_s`. A source that fails is logged once (until it works
    again) and the next is tried; with none answering the last answer is kept."""

    def __init__(
        self,
        sources: list[PodSource],
        *,
        refresh_s: float = 10.0,
        min_forced_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sources = sources
        self.refresh_s = refresh_s
        # A forced refresh (a process in a pod not listed yet) asks the API server at most this
        # often, however many new processes appear at once.
        self.min_forced_s = min_forced_s
        self.monotonic = monotonic
        self._forced_at: float | None = None
        self.reads = 0  # source reads, for tests and doctor
        self._by_uid: dict[str, PodInfo] = {}
        self._by_name: dict[tuple[str, str], PodInfo] = {}
        self._refreshed: float | None = None
        self._failing: set[str] = set()
        self.source_used: str | None = None

    def refresh(self, now: float, *, force: bool = False) -> None:
        if force:
            mono = self.monotonic()
            if self._forced_at is not None and mono - self._forced_at < self.min_forced_s:
                return
            self._forced_at = mono
        elif self._refreshed is not None and now - self._refreshed < self.refresh_s:
            return
        self._refreshed = now
        for source in self.sources:
            self.reads += 1
            try:
                pods = source.pods()
            except (OSError, ValueError) as exc:
                if source.name not in self._failing:
                    self._failing.add(source.name)
                    log.warning("kubernetes %s unavailable: %s", source.name, exc)
                continue
            if source.name in self._failing:
                self._failing.discard(source.name)
                log.info("kubernetes %s answers again", source.name)
            self.source_used = source.name
            self._by_uid = {p.uid: p for p in pods}
            self._by_name = {(p.namespace, p.name): p for p in pods}
            return

    def by_uid(self, uid: str) -> PodInfo | None:
        return self._by_uid.get(uid)

    def by_name(self, namespace: str, name: str) -> PodInfo | None:
        return self._by_name.get((namespace, name))
