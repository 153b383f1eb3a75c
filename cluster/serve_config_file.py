"""Serve config files (``ray_configs/serve_*.yaml``) for ``specray serve --config``, loaded strictly.

Ray's ``ServeDeploySchema`` ignores keys it does not know, so a misspelt ``http_option`` or
``max_ongoing_request`` would silently fall back to a default. Here every key is first checked
against the schema, then the file is validated by ``ServeDeploySchema``, each application's
``args`` by ``ServeArgs``, and every import path (application builders, gRPC servicer functions)
is resolved: all before Ray starts, each failure one line naming the file and the key.

``specray serve`` runs a file with ``serve.start`` + ``serve.run``, which cannot apply some of what
``serve deploy`` can (per-application runtime_env, ``deployments:`` overrides, ...). Those keys are
rejected with a pointer to where the setting goes instead of being silently dropped.
"""
from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from cluster.validation import CONFIG_FILE, format_validation_error, key_path

# Keys ``serve.start`` + ``serve.run`` cannot apply, and what to do instead.
_NOT_APPLIED_TOP = {"target_capacity": "use `serve deploy` to set it"}
_NOT_APPLIED_APP = {
    "deployments": "set deployment options under args (ServeArgs: num_replicas, autoscaling, num_gpus, ...)",
    "runtime_env": "install specray on the nodes (ray_configs/cluster.yaml) or use `serve deploy`",
    "autoscaling_policy": "set args.autoscaling instead",
    "host": "set http_options.host instead",
    "port": "set http_options.port instead",
}


class ConfigFileError(ValueError):
    """One line: the file, the key (as a path such as ``applications[0].args.engine``) and the fix."""


def read_yaml(path: str | Path) -> dict:
    """The file's mapping; unreadable files, YAML syntax errors and non-mappings are ConfigFileError."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigFileError(f"--config {str(path)!r}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigFileError(f"{path}{where}: not valid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a mapping of Serve config keys, got {type(data).__name__}")
    return data


def _model_of(annotation) -> type[BaseModel] | None:
    """The pydantic model a field holds, directly or inside Optional/Union/List (None for plain values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def unknown_keys(model: type[BaseModel], data: Any, loc: tuple = ()) -> list[tuple[tuple, list[str]]]:
    """Every key in ``data`` (recursively) that ``model`` has no field for: (location, known names)."""
    if not isinstance(data, dict) or model.model_config.get("extra") == "allow":
        return []
    by_name = {**{f.alias: f for f in model.model_fields.values() if f.alias}, **model.model_fields}
    found = []
    for key, value in data.items():
        if key not in by_name:
            found.append((loc + (key,), sorted(model.model_fields)))
            continue
        sub = _model_of(by_name[key].annotation)
        if sub is None:
            continue
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            found += unknown_keys(sub, item, loc + (key,) + (() if i is None else (i,)))
    return found


def _app_args_errors(err: ValidationError, index: int) -> str:
    return format_validation_error(err, CONFIG_FILE, prefix=("applications", index, "args"))


def validate_serve_config(path: str | Path, raw: dict):
    """Strict key check, then ``ServeDeploySchema``, then keys ``specray serve`` cannot apply."""
    from ray.serve.schema import ServeDeploySchema

    bad = unknown_keys(ServeDeploySchema, raw)
    if bad:
        loc, known = bad[0]
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        raise ConfigFileError(f"{path}: unknown key {key_path(loc)} ({hint})")
    try:
        config = ServeDeploySchema.model_validate(raw)
    except ValidationError as e:
        raise ConfigFileError(f"{path}: {format_validation_error(e, CONFIG_FILE)}") from None
    for key, fix in _NOT_APPLIED_TOP.items():
        if raw.get(key) is not None:
            raise ConfigFileError(f"{path}: {key} is not applied by `specray serve`: {fix}")
    for i, app in enumerate(raw.get("applications") or []):
        for key, fix in _NOT_APPLIED_APP.items():
            if app.get(key):
                raise ConfigFileError(f"{path}: applications[{i}].{key} is not applied by `specray serve`: {fix}")
    return config


def validate_app_args(path: str | Path, index: int, args: dict):
    """An application's ``args`` as ``ServeArgs`` (unknown keys and bad values named)."""
    from deployments.serve_config import ServeArgs

    try:
        return ServeArgs.model_validate(args or {})
    except ValidationError as e:
        raise ConfigFileError(f"{path}: {_app_args_errors(e, index)}") from None


def resolve_import(path: str | Path, loc: str, import_path: str):
    """The callable at ``import_path`` (``module:attr`` or ``module.attr``), or a one-line error."""
    from ray._common.utils import import_attr

    try:
        obj = import_attr(import_path)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigFileError(f"{path}: {loc}={import_path!r}: cannot import it ({e})") from None
    if not callable(obj):
        raise ConfigFileError(f"{path}: {loc}={import_path!r} is a {type(obj).__name__}, not a callable")
    return obj


@dataclass(frozen=True)
class ServeApp:
    """One application of the file, built and ready for ``serve.run``."""

    name: str
    route_prefix: str | None
    app: Any  # ray.serve.Application
    model_name: str
    run_options: dict = field(default_factory=dict)  # logging_config / external_scaler_enabled when set
    args: Any = None  # its ServeArgs (checked against the cluster before it deploys)


@dataclass(frozen=True)
class ServeFile:
    path: str
    config: Any  # ray.serve.schema.ServeDeploySchema
    apps: list[ServeApp]

    def start_options(self) -> dict:
        """Keyword arguments of ``serve.start``: proxies, HTTP and gRPC options, as the file says."""
        c = self.config
        opts = {"proxy_location": c.proxy_location, "http_options": c.http_options.model_dump(),
                "grpc_options": c.grpc_options.model_dump()}
        for key in ("logging_config", "tracing_config", "controller_options"):
            if getattr(c, key) is not None:
                opts[key] = getattr(c, key)
        return opts


def _build(path: str | Path, index: int, app_schema, args) -> ServeApp:
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    loc = f"applications[{index}].import_path"
    builder = resolve_import(path, loc, app_schema.import_path)
    try:
        app = call_user_app_builder_with_args_if_necessary(builder, app_schema.args)
    except ValidationError as e:
        raise ConfigFileError(f"{path}: {_app_args_errors(e, index)}") from None
    except (TypeError, ValueError) as e:
        raise ConfigFileError(f"{path}: {loc}={app_schema.import_path!r}: {e}") from None
    run_options = {k: getattr(app_schema, k) for k in ("logging_config", "external_scaler_enabled")
                   if k in app_schema.model_fields_set}
    return ServeApp(app_schema.name, app_schema.route_prefix, app, args.model_name, run_options, args)


def load_serve_file(path: str | Path) -> ServeFile:
    """Read, validate and build everything in a Serve config file; raises ConfigFileError."""
    raw = read_yaml(path)
    config = validate_serve_config(path, raw)
    if not config.applications:
        raise ConfigFileError(f"{path}: applications is empty: nothing to serve")
    for i, fn in enumerate(config.grpc_options.grpc_servicer_functions):
        resolve_import(path, f"grpc_options.grpc_servicer_functions[{i}]", fn)
    all_args = [validate_app_args(path, i, a.args) for i, a in enumerate(config.applications)]
    apps = [_build(path, i, a, args) for i, (a, args) in enumerate(zip(config.applications, all_args))]
    return ServeFile(str(path), config, apps)
