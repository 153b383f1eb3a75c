"""The one validation-error formatter (cluster/validation.py): the exact one-line texts of each edge."""
from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cluster.validation import CONFIG_FILE, FLAGS, REQUEST, first_field, format_validation_error, key_path


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(1, ge=1)
    tree: str | None = None

    @field_validator("tree")
    @classmethod
    def _tree(cls, v):
        if v is not None and not v.isdigit():
            raise ValueError(f"tree {v!r}: use digits")
        return v


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: Inner = Field(default_factory=Inner)
    messages: list[Message] = []
    low: int = 0
    high: int = 1

    @model_validator(mode="after")
    def _order(self):
        if self.high < self.low:
            raise ValueError(f"high={self.high} is below low={self.low}")
        return self


def errors_of(**fields) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        Outer(**fields)
    return e.value


def test_flags_style():
    assert format_validation_error(errors_of(inner={"size": 0})) == \
        "inner.size=0: Input should be greater than or equal to 1"
    # the project's own validators name the value: it is not repeated
    assert format_validation_error(errors_of(inner={"tree": "a,b"})) == "inner.tree: tree 'a,b': use digits"
    assert format_validation_error(errors_of(low=3, high=1)) == "value: high=1 is below low=3"
    assert format_validation_error(errors_of(inner={"sise": 2})) == "inner.sise=2: Extra inputs are not permitted"
    assert format_validation_error(errors_of(inner=[1])) == \
        "inner=[1]: Input should be a valid dictionary or instance of Inner"


def test_config_file_style_names_the_key_path_from_the_top_of_the_file():
    prefix = ("applications", 0, "args")
    fmt = lambda err: format_validation_error(err, CONFIG_FILE, prefix)  # noqa: E731
    assert fmt(errors_of(inner={"size": 0})) == \
        "applications[0].args.inner.size=0: Input should be greater than or equal to 1"
    assert fmt(errors_of(inner={"sise": 2})) == "unknown key applications[0].args.inner.sise"
    assert fmt(errors_of(inner=[1])) == \
        "applications[0].args.inner: Input should be a valid dictionary or instance of Inner"
    assert fmt(errors_of(low=3, high=1)) == "applications[0].args: high=1 is below low=3"
    assert fmt(errors_of(messages=[{"role": "x", "content": "y"}])) == \
        "applications[0].args.messages[0].role='x': Input should be 'user' or 'assistant'"


def test_request_style_repeats_values_but_not_missing_fields():
    assert format_validation_error(errors_of(messages=[{"role": "x", "content": "y"}]), REQUEST) == \
        "messages.0.role='x': Input should be 'user' or 'assistant'"
    assert format_validation_error(errors_of(messages=[{"role": "user"}]), REQUEST) == \
        "messages.0.content: Field required"
    assert format_validation_error(errors_of(inner={"tree": "a"}), REQUEST) == "inner.tree='a': tree 'a': use digits"


def test_request_style_leaves_out_fastapis_body_prefix():
    errors = [{"type": "extra_forbidden", "loc": ("body", "max_token"), "msg": "Extra inputs are not permitted",
               "input": 3},
              {"type": "missing", "loc": ("body", "prompt"), "msg": "Field required", "input": {}}]
    assert format_validation_error(errors, REQUEST) == \
        "max_token=3: Extra inputs are not permitted; prompt: Field required"
    assert first_field(errors) == "max_token"
    whole = [{"type": "model_attributes_type", "loc": ("body",), "msg": "Input should be a valid dictionary",
              "input": [1]}]
    assert format_validation_error(whole, REQUEST) == "body=[1]: Input should be a valid dictionary"
    assert first_field(whole) is None


def test_several_errors_and_first_field():
    err = errors_of(inner={"size": 0}, messages=[{"role": "user", "content": 5}])
    assert format_validation_error(err, REQUEST) == ("inner.size=0: Input should be greater than or equal to 1; "
                                                     "messages.0.content=5: Input should be a valid string")
    assert first_field(err) == "inner"
    assert first_field(errors_of(low=3, high=1)) is None
    assert first_field([]) is None


def test_key_path():
    assert key_path(("applications", 0, "args", "engine")) == "applications[0].args.engine"
    assert key_path((0, "x")) == "[0].x"
    assert key_path(()) == ""
    assert FLAGS.whole == "value" and CONFIG_FILE.whole == "" and REQUEST.whole == "body"
