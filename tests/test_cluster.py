"""Cluster-ready jobs: weight-sync transports, a loopback-only local Ray, placement, and `ray job submit` on a
two-node cluster started on this machine.

- Pure pieces (no Ray): transport choice, bucket packing, bundles, config keys.
- `TestLocalRun`: the launcher's `build_workers` on a private local Ray — 2 vLLM engines, 2 DeepSpeed ZeRO-3
  learner ranks (parameters partitioned: every sync gathers them), 1 reward actor. It checks the listening
  sockets of the run's Ray processes and the token, and moves weights through every transport that runs on CPU
  (file, ray, native_ray = vLLM's native nccl/ipc lifecycle with Ray as the data plane).
- `test_ray_job_submit_on_two_nodes`: `ray start` a head and a second node (own temp dir, explicit free ports,
  token auth), `ray job submit --working-dir` the tiny job with engines pinned to one node and learners to the
  other, wait for SUCCEEDED, check metrics.jsonl and where every actor ran, and stop exactly what was started.

Checksums: `rl.train.workers.tensor_checksums` (float64 sum + 1e-3 x sum of squares per tensor) of the same fp32 values
are equal up to float64 summation order; vLLM's live weights are read back exactly (rollout/vllm_checksums.py), so
engines and reference agree to rel 1e-12, while a perturbation of 1e-3 per weight moves them by far more.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import ROOT, TINY_ARITH_MIXED
from safetensors.torch import save_file

from actors.placement import plan_bundles
from actors.weight_sync import (
    FileSync,
    RayBuckets,
    make_transport,
    pack_bucket,
    resolve_transport,
    unpack_bucket,
)
from actors.weight_transfer import GatheredWeights
from rl.config import ConfigError, load_config
from rl.train.workers import tensor_checksums

CKPT = str(TINY_ARITH_MIXED)
VENV_BIN = Path(sys.executable).parent
LOOPBACK_PREFIXES = ("127.", "::1", "::ffff:127.")


def cfg_of(*overrides, path=None):
    return load_config(path, list(overrides))


# ---- pure pieces --------------------------------------------------------------------------------------------
class _Placed:
    def __init__(self, rollout_nodes, learner_nodes):
        self.rollout_nodes, self.learner_nodes = rollout_nodes, learner_nodes


def test_auto_transport_follows_placement_and_refusals_name_the_key():
    cpu = cfg_of()
    assert resolve_transport(cpu, None)[0] == "file"
    assert resolve_transport(cpu, _Placed(["a", "a"], ["a", "b"]))[0] == "file"  # engines on rank 0's node
    assert resolve_transport(cpu, _Placed(["a", "b"], ["a", "b"]))[0] == "ray"  # one engine elsewhere
    gpu = cfg_of("rollout.num_gpus_per_engine=1", "learner.num_gpus_per_worker=1")
    assert resolve_transport(gpu, _Placed(["a"], ["b"]))[0] == "nccl"
    assert (
        resolve_transport(
            cfg_of("rollout.num_gpus_per_engine=1", "learner.num_gpus_per_worker=1", "ray.colocate=true"),
            _Placed(["a"], ["a"]),
        )[0]
        == "ipc"
    )
    with pytest.raises(ValueError, match="rollout.weight_sync='nccl'.*GPU"):
        resolve_transport(cfg_of("rollout.weight_sync=nccl"), _Placed(["a"], ["a"]))
    with pytest.raises(ValueError, match="rollout.weight_sync='ipc'.*colocate"):
        resolve_transport(
            cfg_of("rollout.weight_sync=ipc", "rollout.num_gpus_per_engine=1", "learner.num_gpus_per_worker=1"),
            _Placed(["a"], ["a"]),
        )
    with pytest.raises(ValueError, match="rollout.weight_sync='native_ray'.*rollout.engine is 'torch'"):
        resolve_transport(cfg_of("rollout.weight_sync=native_ray", "rollout.engine=torch"), _Placed(["a"], ["a"]))
    with pytest.raises(ValueError, match="rollout.weight_sync='ray' needs Ray actors"):
        resolve_transport(cfg_of("rollout.weight_sync=ray"), None)


def test_local_ray_reports_task_events_only_with_a_dashboard(monkeypatch):
    """Every task's events go to the GCS for the dashboard's task views, ~3.4 KB each, kept up to 100,000 tasks:
    the soak's GCS grew +7 % per 100 steps, and 12,000 calls on a bare local Ray took it from 45 to 90 MiB (46 with
    reporting off). Without the dashboard (the default) nothing reads them, so a local Ray reports none. Its workers
    run at nice 0 (Ray's default is 15), above the live plots' process (19)."""
    import ray

    from actors import placement, resources

    started = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(placement, "start_local_ray", lambda **kwargs: started.append(kwargs))
    monkeypatch.delenv(resources.JOB_ENV, raising=False)
    for dashboard in (False, True):
        placement.init_ray(load_config(None, [f"ray.dashboard={str(dashboard).lower()}"]))
    assert started[0]["_system_config"] == {"worker_niceness": 0, "task_events_report_interval_ms": 0}
    assert started[1]["_system_config"] == {"worker_niceness": 0} and started[1]["dashboard_host"] == "127.0.0.1"


def test_no_local_ray_starts_without_a_token():
    """A local Ray accepts any connection from the machine unless it runs with token authentication, so every local
    Ray this repository starts (the product, its tests, benchmarks and tools) goes through
    `placement.start_local_ray` (127.0.0.1, a fresh token per run), and nothing turns authentication off."""

    files = subprocess.run(["git", "ls-files", "*.py", "Makefile", ".ci/*"], cwd=ROOT, capture_output=True, text=True)
    found = []
    for name in files.stdout.split():
        text = (ROOT / name).read_text()
        if name != "actors/placement.py" and re.search(r"ray\.init\(\s*(address\s*=\s*['\"]local|\))", text):
            found.append(f"{name}: ray.init of a local Ray (use actors.placement.start_local_ray)")
        if re.search(r"RAY_AUTH_MODE\W+disabled", text) and name != "tests/test_cluster.py":
            found.append(f"{name}: RAY_AUTH_MODE disabled")
    assert not found, found


def test_buckets_round_trip_every_dtype_and_shape():
    g = torch.Generator().manual_seed(0)
    named = [
        ("w", torch.randn(3, 5, generator=g)),
        ("b", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("s", torch.tensor(2.5)),
        ("t", torch.randn(4, 6, generator=g).t()),  # 0-dim, non-contiguous
        ("h", torch.randn(2, 2, generator=g).half()),
    ]
    got = unpack_bucket(pack_bucket(named))
    assert list(got) == [n for n, _ in named]
    for name, t in named:
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t)


def test_bundles_carry_role_resources_and_config_checks_them():
    cfg = cfg_of(
        "rollout.num_engines=2",
        "learner.num_workers=2",
        "ray.rollout_resources={gen: 1}",
        "ray.learner_resources={train: 0.5}",
        "ray.placement=spread",
    )
    bundles, r_idx, l_idx, share = plan_bundles(cfg)
    assert [bundles[i] for i in r_idx] == [{"CPU": 1.0, "gen": 1.0}] * 2
    assert [bundles[i] for i in l_idx] == [{"CPU": 1.0, "train": 0.5}] * 2 and share == 1.0
    colo, _, _, share = plan_bundles(
        cfg_of(
            "ray.colocate=true",
            "ray.rollout_resources={gen: 1}",
            "ray.learner_resources={train: 2}",
            "learner.num_workers=2",
        )
    )
    assert colo == [{"CPU": 1.0, "gen": 1.0, "train": 2.0}] * 2 and share == 0.5
    with pytest.raises(ConfigError, match="ray.rollout_resources"):
        cfg_of("ray.rollout_resources={GPU: 1}")
    with pytest.raises(ConfigError, match="rollout.weight_sync.*did you mean 'ray'"):
        cfg_of("rollout.weight_sync=rey")


def test_gathered_weights_announce_full_shapes_under_zero3():
    """vLLM sizes its receive buffers from metadata(); a ZeRO-3 parameter is an empty shard whose full shape is
    `ds_shape`, so that is what must be announced; iteration yields what the gather context exposes."""
    lin = torch.nn.Linear(4, 3)
    full = {n: p.detach().clone() for n, p in lin.named_parameters()}
    name_of = {id(p): n for n, p in lin.named_parameters()}
    for p in lin.parameters():
        p.ds_shape = p.shape
        p.data = torch.empty(0)
    gathers = []

    class Gather:  # stands in for deepspeed.zero.GatheredParameters([p])
        def __init__(self, p):
            self.p = p

        def __enter__(self):
            gathers.append(name_of[id(self.p)])
            self.p.data = full[name_of[id(self.p)]].clone()

        def __exit__(self, *exc):
            self.p.data = torch.empty(0)

    src = GatheredWeights(lin, Gather)
    assert [(m.name, m.shape) for m in src.metadata()] == [("weight", (3, 4)), ("bias", (3,))]
    got = dict(src)
    assert gathers == ["weight", "bias"] and all(torch.equal(got[n], full[n]) for n in full)
    assert all(p.numel() == 0 for p in lin.parameters())  # released again; the yielded copies stay valid


# ---- a local run: 2 vLLM engines, 2 ZeRO-3 ranks ---------------------------------------------------------------
def _descendants_listening(root: psutil.Process, session_dir: str) -> dict:
    """{(pid, name): [listening address]} of the Ray processes of this run: the processes whose command line names
    its session directory (gcs_server, raylet, dashboard, monitors) and everything they started (workers, agents)."""
    ray_procs = set()
    for child in root.children(recursive=True):
        try:
            if any(session_dir in a for a in child.cmdline()):
                ray_procs.add(child)
                ray_procs.update(child.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    pids = {p.pid: p for p in ray_procs}
    out = {}
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            try:
                name = pids[c.pid].name()
            except psutil.NoSuchProcess:
                continue
            out.setdefault((c.pid, name), []).append(c.laddr.ip)
    return out


def _gcs_call(address: str, token: str | None):
    """GetClusterId on the GCS with (or without) a bearer token; returns the gRPC status code."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(ch)
        md = [("authorization", f"Bearer {token}")] if token is not None else []
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), metadata=md, timeout=20)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def _perturbed(path: Path, ref: dict, scale: float) -> str:
    g = torch.Generator().manual_seed(int(scale * 1e6))
    save_file({k: (v + scale * torch.randn(v.shape, generator=g)).contiguous() for k, v in ref.items()}, str(path))
    return str(path)


class TestLocalRun:
    @pytest.fixture(scope="class")
    def run(self):
        import ray

        from actors.placement import build_workers
        from rl.model.files import load_fbt

        cfg = load_config(
            str(ROOT / "configs" / "tiny.yaml"),
            [
                f"model.path={CKPT}",
                "rollout.engine=vllm",
                "rollout.num_engines=2",
                "learner.num_workers=2",
                "learner.zero_stage=3",
                "rollout.weight_sync=native_ray",
                "rollout.vllm.max_num_seqs=16",
                "ray.num_cpus=6",
            ],
        )
        lines = []
        workers = build_workers(cfg, use_ray=True, log=lines.append)
        ref = {n: p.detach().clone() for n, p in load_fbt(CKPT).named_parameters()}
        # what the engines compute with the checkpoint's weights, as vLLM loaded them itself (before any sync):
        # checksums cannot see a stale repacked LM head (tied to the embedding they do read), log-probs can
        ref_out = _outputs(workers[0])
        try:
            yield cfg, workers, (ref, ref_out), lines
        finally:
            for w in workers:
                w.close()
            ray.shutdown()

    def test_ray_listens_on_loopback_only_and_every_rpc_needs_the_run_token(self, run):
        import grpc
        import ray

        node = ray._private.worker._global_node
        listening = _descendants_listening(psutil.Process(), node.get_session_dir_path())
        names = {name for _, name in listening}
        # not vacuous: the core daemons and the actors' workers are among what was checked
        assert {"gcs_server", "raylet"} <= names and sum(n.startswith("ray::") for n in names) >= 4, listening
        outside = {k: [a for a in v if not a.startswith(LOOPBACK_PREFIXES)] for k, v in listening.items()}
        assert not any(outside.values()), f"listening beyond loopback: {outside}"
        assert node.node_ip_address == "127.0.0.1"
        gcs = node.gcs_address
        assert gcs.startswith("127.0.0.1:")
        assert _gcs_call(gcs, None) == grpc.StatusCode.UNAUTHENTICATED
        assert _gcs_call(gcs, "0" * 64) == grpc.StatusCode.UNAUTHENTICATED
        assert _gcs_call(gcs, os.environ["RAY_AUTH_TOKEN"]) == grpc.StatusCode.OK

    def test_placement_and_transport_are_logged(self, run):
        cfg, (rollout, learner, rewards), _, lines = run
        text = "\n".join(lines)
        for role, n in (("rollout engine", 2), ("learner rank", 2), ("reward actor", 1)):
            assert len(re.findall(rf"placement: {role} \d on node [0-9a-f]{{56}} \(127\.0\.0\.1\)", text)) == n
        assert "weight sync: native_ray (rollout.weight_sync)" in text

    @pytest.mark.parametrize("transport", ["file", "ray", "native_ray"])
    def test_transport_puts_the_gathered_weights_on_every_engine(self, run, transport, tmp_path):
        """Engines are first set to perturbed weights (a file, version v); the transport then pushes the ZeRO-3
        learners' weights (still the checkpoint's) as v + 1: every engine must hold exactly the checkpoint's
        weights — an independent reference, so a partial or missing gather fails — and refuse newer versions."""
        from rollout.engine import StaleWeightsError

        cfg, (rollout, learner, _), (ref, ref_out), _ = run
        v = max(rollout.versions()) + 1
        want = tensor_checksums(ref.items())
        assert rollout.load_weights(_perturbed(tmp_path / "noise.safetensors", ref, 1e-3), v) == [v, v]
        assert all(c != pytest.approx(want, rel=1e-6) for c in rollout.all_weight_checksums())
        assert _outputs(rollout) != pytest.approx(ref_out, abs=1e-6)
        rollout.transport = make_transport(cfg, transport)
        assert rollout.sync_weights(learner, v + 1, str(tmp_path / "weights" / "w.safetensors")) == [v + 1, v + 1]
        for got in rollout.all_weight_checksums():
            assert got == pytest.approx(want, rel=1e-12)
        # same weights, same prompts, greedy: the same tokens and log-probs as the engines' own checkpoint load
        # (1e-6: fp32 kernels on identical inputs; the perturbation above moves them by ~1e-3)
        assert _outputs(rollout) == pytest.approx(ref_out, abs=1e-6)
        assert (tmp_path / "weights").exists() == (transport == "file")  # only the file transport touches disk
        with pytest.raises(StaleWeightsError):
            rollout.generate([[1, 5, 6]], _greedy(), min_version=v + 2)

    def test_native_transfer_refuses_to_generate_until_tagged(self, run):
        import ray

        from rollout.engine import StaleWeightsError

        cfg, (rollout, learner, _), _, _ = run
        engine = rollout.actors[0]
        v = max(rollout.versions())
        ray.get(engine.start_weight_update.remote())
        with pytest.raises(StaleWeightsError, match="native weight transfer"):
            ray.get(engine.generate.remote([[1, 5, 6]], _greedy(), v))
        ray.get(engine.finish_weight_update.remote(None))
        with pytest.raises(StaleWeightsError):  # finished but not tagged: still refused
            ray.get(engine.generate.remote([[1, 5, 6]], _greedy(), v))
        assert ray.get(engine.set_weight_version.remote(v + 1)) == v + 1
        ray.get(rollout.actors[1].set_weight_version.remote(v + 1))
        assert len(rollout.generate([[1, 5, 6]], _greedy(), min_version=v + 1)) == 1

    def test_an_update_reaches_every_engine_through_ray(self, run, tmp_path):
        """After a real DeepSpeed update (ZeRO-3, 2 ranks) the ray transport delivers the new weights."""
        cfg, (rollout, learner, _), (ref, _), _ = run
        v = max(rollout.versions())
        from rl.train.requests import sampling_params

        samples = rollout.generate([[1, 5, 6, 7], [1, 8, 9]], sampling_params(cfg, 2, seed=0), min_version=v)
        learner.update(samples, [1.0 if i % 2 else -1.0 for i in range(len(samples))])
        after = learner.weight_checksums()
        assert after != pytest.approx(tensor_checksums(ref.items()), rel=1e-9)
        rollout.transport = make_transport(cfg, "ray")
        assert rollout.sync_weights(learner, v + 1, str(tmp_path / "w.safetensors")) == [v + 1, v + 1]
        for got in rollout.all_weight_checksums():
            assert got == pytest.approx(after, rel=1e-12)


PROMPTS = [[1, 5, 6, 7], [1, 8, 9, 10, 11], [1, 12]]


def _outputs(rollout) -> list[float]:
    """Greedy tokens and their log-probs on every engine (each engine answers every prompt), flattened."""
    out = []
    for k in range(len(rollout.actors)):
        import ray

        samples = ray.get(rollout.actors[k].generate.remote(PROMPTS, _greedy(16), max(rollout.versions())))
        out += [float(t) for s in samples for t in s.response_ids] + [lp for s in samples for lp in s.logprobs]
    return out


def _greedy(max_tokens=4):
    from rl.samples.request import SamplingParams

    return SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, stop_token_ids=(2,))


def test_file_transport_names_the_fix_when_an_engine_cannot_see_the_file(tmp_path):
    class Learner:
        def export_weights(self, path):
            return path  # "written" on another node: not here

    class Rollout:
        def load_weights(self, path, version):
            raise FileNotFoundError(path)

    with pytest.raises(RuntimeError, match="train.run_dir on storage every node sees.*weight_sync: ray"):
        FileSync().push(Learner(), Rollout(), 1, str(tmp_path))
    assert isinstance(RayBuckets().refs, list)


# ---- a two-node cluster on this machine, and `ray job submit` --------------------------------------------------
def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class TwoNodeCluster:
    """A head and a second node started with `ray start` for this test only: own temp dirs (short, for the unix
    socket path limit), explicit free ports, token auth with a fresh token. `stop()` ends exactly the processes
    whose command line names this cluster (its temp dirs or its GCS address) and their children — never
    `ray stop`, which would end other people's clusters on this machine."""

    SMALL = ("--object-store-memory=300000000", "--disable-usage-stats")  # a shared 24 GiB machine

    def __init__(self, head_resources: dict, node_resources: dict, cpus=(4, 2), hide: str | None = None):
        # one temp dir per node, as on separate machines: a node's runtime-env agent manages (and deletes) the
        # unpacked working directories under its temp dir, which must not be the other node's
        self.temp = tempfile.mkdtemp(prefix="r13", dir="/tmp")
        self.temp_b = tempfile.mkdtemp(prefix="r13", dir="/tmp")
        gcs, dash, agent1, agent2, client, metrics1, metrics2, rt1, rt2 = _free_ports(9)
        self.gcs_port, self.dashboard = gcs, f"http://127.0.0.1:{dash}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_HOST"))}
        self.env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=os.urandom(24).hex(),
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
            RAY_USAGE_STATS_ENABLED="0",
            WANDB_MODE="offline",
            TOKENIZERS_PARALLELISM="false",
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
        )
        self.env.pop("PYTHONPATH", None)  # the job's code comes from its --working-dir
        ray_bin = str(VENV_BIN / "ray")
        head = self._run(
            [
                ray_bin,
                "start",
                "--head",
                f"--temp-dir={self.temp}",
                f"--port={gcs}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dash}",
                f"--dashboard-agent-listen-port={agent1}",
                f"--ray-client-server-port={client}",
                f"--metrics-export-port={metrics1}",
                f"--runtime-env-agent-port={rt1}",
                f"--num-cpus={cpus[0]}",
                f"--resources={json.dumps(head_resources)}",
                *self.SMALL,
            ]
        )
        self.ip = re.search(r"Local node IP: (\S+)", _plain(head.stdout + head.stderr)).group(1)
        # `hide`: the second node sees an empty directory there (its own mount namespace, a tmpfs over it), as a
        # machine without the head's storage would
        self.hidden = bool(hide) and _can_hide()
        prefix = (
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount -t tmpfs fbrl-hidden "$0" && exec "$@"',
                hide,
            ]
            if self.hidden
            else []
        )
        self._run(
            [
                *prefix,
                ray_bin,
                "start",
                f"--address={self.ip}:{gcs}",
                f"--temp-dir={self.temp_b}",
                f"--dashboard-agent-listen-port={agent2}",
                f"--metrics-export-port={metrics2}",
                f"--runtime-env-agent-port={rt2}",
                f"--num-cpus={cpus[1]}",
                f"--resources={json.dumps(node_resources)}",
                *self.SMALL,
            ]
        )

    def _run(self, cmd, timeout=180, check=True):
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def python(self, code: str, timeout=120) -> str:
        """Run `code` in a fresh interpreter connected to this cluster (with its token); return stdout."""
        env = dict(self.env, RAY_ADDRESS=f"{self.ip}:{self.gcs_port}")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-3000:])
        return r.stdout

    def processes(self) -> list[psutil.Process]:
        mine = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if self.temp in cmd or self.temp_b in cmd or f"{self.ip}:{self.gcs_port}" in cmd:
                mine.append(p)
        kids = [c for p in mine for c in _children(p)]
        return list({p.pid: p for p in mine + kids}.values())

    def stop(self) -> list[int]:
        procs = self.processes()
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=15)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        shutil.rmtree(self.temp, ignore_errors=True)
        shutil.rmtree(self.temp_b, ignore_errors=True)
        return [p.pid for p in procs]


def _can_hide() -> bool:
    """Whether this machine lets us give a process its own mount namespace (root, or a container that allows it)."""
    if not shutil.which("unshare"):
        return False
    probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs fbrl-probe /mnt"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # ray start colours its output


def _children(p):
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_ray_job_submit_on_two_nodes(tmp_path):
    """The documented path (docs/CLUSTER.md): submit the tiny job with `ray job submit --working-dir`, engines
    asked onto the node with resource `gen`, learners and rewards onto the head (`train`)."""
    (tmp_path / "on_the_head").touch()
    cluster = TwoNodeCluster({"train": 4}, {"gen": 2}, hide=str(tmp_path))  # RUN_DIR's parent: not on "gen"
    try:
        nodes, seen_on_gen = json.loads(
            cluster.python(
                "import json, os, ray; ray.init(address=os.environ['RAY_ADDRESS'], log_to_driver=False); "
                f"ls = ray.remote(resources={{'gen': 1}}, num_cpus=0)(lambda: os.listdir({str(tmp_path)!r})); "
                "print(json.dumps([{n['NodeID']: n['Resources'] for n in ray.nodes() if n['Alive']}, "
                "ray.get(ls.remote())]))"
            ).splitlines()[-1]
        )
        train_node = next(n for n, res in nodes.items() if "train" in res)
        gen_node = next(n for n, res in nodes.items() if "gen" in res)
        assert len(nodes) == 2 and train_node != gen_node
        # the engines' node cannot see RUN_DIR: weights must reach it over the network (where unshare works; it
        # does on this machine, and the job then fails with rollout.weight_sync=file: "mutation" in the commit)
        assert seen_on_gen == ([] if cluster.hidden else ["on_the_head"]), seen_on_gen
        # no train.run_dir, as docs/CLUSTER.md submits it: the job runs in Ray's copy of the working dir and must
        # put its run somewhere that lasts ($FBRL_RUNS_DIR here, ~/fbrl-runs by default) and say where first
        runs = tmp_path / "runs"
        sub_id = f"fbrl-test-{os.getpid()}-{int(time.time())}"
        runtime_env = {
            "excludes": [".git", "runs", ".venv", "wandb", "__pycache__"],
            "env_vars": {"FBRL_RUNS_DIR": str(runs)},
        }
        submit = cluster._run(
            [
                str(VENV_BIN / "ray"),
                "job",
                "submit",
                f"--address={cluster.dashboard}",
                f"--submission-id={sub_id}",
                f"--working-dir={ROOT}",
                f"--runtime-env-json={json.dumps(runtime_env)}",
                "--",
                "fbrl",
                "train",
                "configs/tiny.yaml",
                "train.steps=2",
                "train.eval_every=0",
                "train.checkpoint_every=2",
                "train.prompts_per_step=8",
                "logging.progress=false",
                "learner.num_workers=2",
                "learner.zero_stage=2",  # a cluster's layout: ranks that reduce
                "ray.rollout_resources={gen: 1}",
                "ray.learner_resources={train: 1}",
                "ray.reward_resources={train: 1}",
            ],
            timeout=900,
            check=False,
        )
        logs = _plain(submit.stdout + submit.stderr)
        said = re.search(r"fbrl train: configs/tiny.yaml -> (\S+)", logs)
        assert said, logs[-6000:]
        run_dir = Path(said.group(1))
        assert run_dir.parent == runs and cluster.temp not in str(run_dir), run_dir  # not in Ray's session copy
        status = cluster._run(
            [str(VENV_BIN / "ray"), "job", "status", f"--address={cluster.dashboard}", sub_id], check=False
        )
        assert f"Job '{sub_id}' succeeded" in _plain(status.stdout + status.stderr), logs[-6000:]  # = SUCCEEDED
        # the rest of docs/CLUSTER.md step 4: list, logs, stop (a second job that would run for 10 minutes)
        ray_job = [str(VENV_BIN / "ray"), "job"]
        assert sub_id in cluster._run(ray_job + ["list", f"--address={cluster.dashboard}"]).stdout
        assert (
            "placement: rollout engine 0 on node"
            in cluster._run(ray_job + ["logs", f"--address={cluster.dashboard}", sub_id]).stdout
        )
        sleeper = f"{sub_id}-stop"
        cluster._run(
            ray_job
            + [
                "submit",
                f"--address={cluster.dashboard}",
                f"--submission-id={sleeper}",
                "--no-wait",
                "--",
                "python",
                "-c",
                "import time; time.sleep(600)",
            ]
        )
        cluster._run(ray_job + ["stop", f"--address={cluster.dashboard}", sleeper], timeout=120)
        stopped = cluster._run(ray_job + ["status", f"--address={cluster.dashboard}", sleeper], check=False)
        assert f"Job '{sleeper}' was stopped" in _plain(stopped.stdout + stopped.stderr), stopped
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "time_sync_s" in r]
        assert [r["step"] for r in steps] == [1, 2] and all(r["policy_version"] >= 2 for r in steps)
        placed = re.findall(r"placement: (rollout engine|learner rank|reward actor) \d on node ([0-9a-f]{56})", logs)
        assert sorted(role for role, _ in placed) == [
            "learner rank",
            "learner rank",
            "reward actor",
            "rollout engine",
        ], logs[-6000:]
        for role, node in placed:
            assert node == (gen_node if role == "rollout engine" else train_node), (role, node, nodes)
        # engines on another node than learner rank 0: auto picked ray, and the engines, which cannot see RUN_DIR,
        # got every version; RUN_DIR/policy (written at the end by learner rank 0 and the driver, both on the head)
        assert "weight sync: ray (auto: engines on other nodes than learner rank 0)" in logs
        assert (run_dir / "policy" / "model.safetensors").is_file()
        assert (run_dir / "config.yaml").is_file() and (run_dir / "checkpoints" / "latest").is_file()
    finally:
        pids = cluster.stop()
    assert pids and not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
