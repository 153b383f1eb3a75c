"""ray_configs/: every YAML is valid for the tool that reads it, and `specray serve --config` rejects
bad files before Ray starts.

Serve configs: strict keys + Ray's ServeDeploySchema, import paths that resolve, ``args`` that
validate as ServeArgs and reach the built deployments. cluster.yaml: Ray's autoscaler schema and
its own checks, plus consistency with the Serve config it hosts. No Ray instance is started here.
(ray_configs/monitoring/ has its own test.)
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import jsonschema
import pytest
import yaml

from cluster.serve_config_file import (ConfigFileError, read_yaml, resolve_import, unknown_keys, validate_app_args,
                                       validate_serve_config)

CONFIGS = Path(__file__).parent.parent / "ray_configs"
ALL_YAML = sorted(p for p in CONFIGS.rglob("*.y*ml") if "monitoring" not in p.relative_to(CONFIGS).parts)
SERVE_FILES = sorted(CONFIGS.glob("serve_*.yaml"))
CLUSTER_FILE = CONFIGS / "cluster.yaml"


def _id(p: Path) -> str:
    return str(p.relative_to(CONFIGS))


def _apps(path: Path):
    config = validate_serve_config(path, read_yaml(path))
    return [(i, app, validate_app_args(path, i, app.args)) for i, app in enumerate(config.applications)]


def test_the_expected_files_exist():
    names = {_id(p) for p in ALL_YAML}
    assert {"serve_local.yaml", "serve_4xa100.yaml", "cluster.yaml"} <= names, names


@pytest.mark.parametrize("path", ALL_YAML, ids=_id)
def test_every_yaml_parses_to_a_mapping(path):
    assert isinstance(yaml.safe_load(path.read_text()), dict)


@pytest.mark.parametrize("path", SERVE_FILES, ids=_id)
def test_serve_config_validates_strictly(path):
    from ray.serve.schema import ServeDeploySchema

    raw = read_yaml(path)
    assert unknown_keys(ServeDeploySchema, raw) == []  # Ray's schema alone would ignore a typo
    config = validate_serve_config(path, raw)
    assert config.applications, "a Serve config with no application serves nothing"
    names = [a.name for a in config.applications]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("path", SERVE_FILES, ids=_id)
def test_args_validate_as_serve_args(path):
    from cluster.config import SpeculativeConfig

    for i, app, args in _apps(path):
        assert args.engine.speculative.enabled, f"{path.name}: applications[{i}] serves without speculation"
        assert isinstance(args.engine.speculative, SpeculativeConfig)


@pytest.mark.parametrize("path", SERVE_FILES, ids=_id)
def test_import_path_resolves_to_a_callable(path):
    for i, app, _ in _apps(path):
        assert callable(resolve_import(path, f"applications[{i}].import_path", app.import_path))


@pytest.mark.parametrize("path", SERVE_FILES, ids=_id)
def test_grpc_servicer_functions_import(path):
    config = validate_serve_config(path, read_yaml(path))
    for i, fn in enumerate(config.grpc_options.grpc_servicer_functions):
        module = fn.rpartition(".")[0]
        try:
            __import__(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                pytest.skip(f"{module} does not exist yet (gRPC ingress not written)")
            raise
        assert callable(resolve_import(path, f"grpc_options.grpc_servicer_functions[{i}]", fn))


@pytest.mark.parametrize("path", SERVE_FILES, ids=_id)
def test_args_reach_the_built_deployments(path):
    """The builder turns args into real deployment options, read back as `serve build` does (no Ray)."""
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve._private.build_app import build_app
    from ray.serve.deployment import deployment_to_schema

    for i, app, args in _apps(path):
        builder = resolve_import(path, f"applications[{i}].import_path", app.import_path)
        built = build_app(call_user_app_builder_with_args_if_necessary(builder, app.args), name=app.name)
        schemas = [deployment_to_schema(d) for d in built.deployments]
        assert built.ingress_deployment_name in {s.name for s in schemas}
        engine = [s for s in schemas if s.ray_actor_options.num_gpus == args.num_gpus
                  and s.ray_actor_options.num_cpus == args.num_cpus]
        assert engine, f"no deployment reserves num_cpus={args.num_cpus}, num_gpus={args.num_gpus}"
        dep = engine[0]
        # Serve admits at least what a replica runs plus queues (the replica answers overload itself).
        assert dep.max_ongoing_requests >= args.max_ongoing_requests + args.max_queued_requests
        assert dep.graceful_shutdown_timeout_s == args.graceful_shutdown_timeout_s
        assert (dep.health_check_period_s, dep.health_check_timeout_s) == (args.health_check_period_s,
                                                                           args.health_check_timeout_s)
        if args.autoscaling is None:
            assert dep.num_replicas == args.num_replicas
        else:
            auto = dep.autoscaling_config
            auto = auto if isinstance(auto, dict) else auto.model_dump()
            want = args.autoscaling
            assert (auto["min_replicas"], auto["max_replicas"], auto["target_ongoing_requests"]) == (
                want.min_replicas, want.max_replicas, want.target_ongoing_requests)


def test_local_config_is_the_cpu_default():
    [(_, app, args)] = _apps(CONFIGS / "serve_local.yaml")
    from cluster.config import DEFAULT_MODEL

    spec = args.engine.speculative  # --draft default: prompt lookup, then the committed EAGLE head
    assert (args.engine.model, args.engine.device) == (DEFAULT_MODEL, "cpu")
    assert (spec.method, spec.lookup_first, spec.eagle_head, spec.adaptive) == ("eagle", True, None, True)
    assert (args.num_replicas, args.num_gpus, args.autoscaling) == (1, 0, None)
    assert (app.name, app.route_prefix) == ("specray", "/")


def test_replica_torch_threads_follow_its_cpu_reservation():
    """An in-process replica's torch threads default to its num_cpus (at least 1), not the node's
    cores; an explicit engine.num_threads wins. The local config relies on it (num_cpus 1)."""
    from deployments.engine_factory import replica_engine_config
    from deployments.serve_config import ServeArgs

    [(_, _, local)] = _apps(CONFIGS / "serve_local.yaml")
    assert local.engine.num_threads is None and replica_engine_config(local).num_threads == int(local.num_cpus) == 1
    assert replica_engine_config(ServeArgs(num_cpus=4)).num_threads == 4
    assert replica_engine_config(ServeArgs(num_cpus=0.5)).num_threads == 1
    explicit = ServeArgs(num_cpus=4, engine={"num_threads": 2})
    assert replica_engine_config(explicit).num_threads == 2
    assert explicit.engine.num_threads == 2 and ServeArgs(num_cpus=4).engine.num_threads is None  # args untouched


def test_4xa100_config_matches_the_cluster():
    """Each replica (its step loop plus one GPU per TP rank, STRICT_PACK) takes one whole GPU node,
    and the cluster can hold max_replicas of them."""
    [(_, app, args)] = _apps(CONFIGS / "serve_4xa100.yaml")
    cluster = read_yaml(CLUSTER_FILE)
    gpu_types = {n: t for n, t in cluster["available_node_types"].items() if t["resources"].get("GPU")}
    assert gpu_types, "cluster.yaml has no GPU node type"
    assert args.tensor_parallel_size == 4 and args.num_gpus == 0
    gpus = args.tensor_parallel_size
    fitting = {n: t for n, t in gpu_types.items() if t["resources"]["GPU"] >= gpus
               and t["resources"].get("CPU", 0) >= args.num_cpus}
    assert fitting, f"no node type fits a replica (tensor_parallel_size={gpus}, num_cpus={args.num_cpus})"
    capacity = sum(t.get("max_workers", cluster["max_workers"]) * int(t["resources"]["GPU"] // gpus)
                   for t in fitting.values())
    assert args.autoscaling is not None and capacity >= args.autoscaling.max_replicas
    assert args.engine.dtype == "bfloat16" and args.engine.device == "cuda"
    assert args.api_key_env and not args.api_key  # keys stay out of the file
    assert args.max_ongoing_requests <= args.engine.max_num_seqs


# ---- cluster.yaml -------------------------------------------------------------------------------
def _ray_schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def test_cluster_yaml_validates_against_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = read_yaml(CLUSTER_FILE)
    jsonschema.validate(raw, _ray_schema())
    validate_config(prepare_config(copy.deepcopy(raw)))  # what `ray up` runs: defaults merged, then checked


def test_cluster_schema_catches_a_typo():
    """The schema check above is real: a misspelt key fails it."""
    raw = read_yaml(CLUSTER_FILE)
    raw["idle_timeout_minute"] = raw.pop("idle_timeout_minutes")
    with pytest.raises(jsonschema.ValidationError, match="idle_timeout_minute"):
        jsonschema.validate(raw, _ray_schema())


def test_cluster_node_types_are_consistent():
    raw = read_yaml(CLUSTER_FILE)
    types = raw["available_node_types"]
    assert raw["head_node_type"] in types
    workers = {n: t for n, t in types.items() if n != raw["head_node_type"]}
    assert workers, "no worker node type"
    for name, t in workers.items():
        assert t.get("min_workers", 0) <= t.get("max_workers", raw["max_workers"]) <= raw["max_workers"], name
    assert sum(t.get("min_workers", 0) for t in workers.values()) <= raw["max_workers"]
    assert raw["upscaling_speed"] > 0 and raw["idle_timeout_minutes"] > 0
    gpu = [t for t in workers.values() if t["resources"].get("GPU") == 4]
    assert gpu and all(t["node_config"]["guestAccelerators"][0]["acceleratorCount"] == 4 for t in gpu)


def test_cluster_installs_pinned_torch_before_the_project():
    raw = read_yaml(CLUSTER_FILE)
    cmds = raw["setup_commands"]
    torch_at = next(i for i, c in enumerate(cmds) if "torch==" in c)
    [checkout] = raw["file_mounts"]  # the one mount: the checkout
    project_at = next(i for i, c in enumerate(cmds) if f"pip install -q -e {checkout}" in c)
    assert torch_at < project_at


# ---- `specray serve --config`: bad files fail before Ray starts ---------------------------------
@pytest.fixture
def refuse_ray(monkeypatch):
    """Rejected configs must fail before Ray or Serve start: starting either fails the test."""
    import ray
    from ray import serve

    def refuse(*args, **kwargs):
        raise AssertionError("Ray or Serve was started for a config that must be rejected first")

    for owner, name in ((ray, "init"), (serve, "start"), (serve, "run")):
        monkeypatch.setattr(owner, name, refuse)


def _serve(capsys, *argv):
    from cluster.cli import main

    code = main(["serve", *argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("edit, key", [
    (lambda c: c.update(http_option=c.pop("http_options")), "http_option"),
    (lambda c: c["grpc_options"].update(prot=9001), "grpc_options.prot"),
    (lambda c: c["applications"][0].update(improt_path="x"), "applications[0].improt_path"),
    (lambda c: c["applications"][0]["args"].update(max_ongoing_request=4), "applications[0].args.max_ongoing_request"),
    (lambda c: c["applications"][0]["args"]["engine"].update(modle="x"), "applications[0].args.engine.modle"),
])
def test_cli_rejects_a_typod_key(capsys, tmp_path, refuse_ray, edit, key):
    config = read_yaml(CONFIGS / "serve_local.yaml")
    edit(config)
    bad = tmp_path / "typo.yaml"
    bad.write_text(yaml.safe_dump(config))
    code, err = _serve(capsys, "--config", str(bad))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert str(bad) in err and f"unknown key {key}" in err, err


def test_cli_rejects_bad_values_bad_yaml_and_conflicting_flags(capsys, tmp_path, refuse_ray):
    config = read_yaml(CONFIGS / "serve_local.yaml")
    config["applications"][0]["args"]["engine"]["speculative"]["num_spec_tokens"] = -1
    bad = tmp_path / "value.yaml"
    bad.write_text(yaml.safe_dump(config))
    code, err = _serve(capsys, "--config", str(bad))
    assert code == 2 and "applications[0].args.engine.speculative.num_spec_tokens=-1" in err

    broken = tmp_path / "broken.yaml"
    broken.write_text("applications:\n  - name: [unclosed\n")
    code, err = _serve(capsys, "--config", str(broken))
    assert code == 2 and f"{broken}:" in err and "not valid YAML" in err

    code, err = _serve(capsys, "--config", str(CONFIGS / "serve_local.yaml"), "--model", "other", "--port", "8001")
    assert code == 2 and "--model, --port conflict with --config" in err

    code, err = _serve(capsys, "--config", str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml" in err


def test_keys_serve_run_cannot_apply_are_rejected(tmp_path):
    """`specray serve` runs apps with serve.run: a `deployments:` override would be silently lost."""
    config = read_yaml(CONFIGS / "serve_local.yaml")
    config["applications"][0]["deployments"] = [{"name": "OpenAIIngress", "num_replicas": 2}]
    with pytest.raises(ConfigFileError, match=r"applications\[0\]\.deployments is not applied"):
        validate_serve_config("f.yaml", config)


def test_makefile_serves_the_local_config():
    makefile = (CONFIGS.parent / "Makefile").read_text()
    serve_recipe = makefile.split("\nserve:", 1)[1].split("\n\n", 1)[0]
    assert "specray serve --config ray_configs/serve_local.yaml" in serve_recipe
    assert os.path.exists(CONFIGS / "serve_local.yaml")
