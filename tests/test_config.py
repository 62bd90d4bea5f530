"""builders/contract/config.py: fields validated from their declarations (type, bounds, choices)."""

import dataclasses

import pytest

from trellis.builders.contract.config import Config, ConfigError, setting, settings


@dataclasses.dataclass(frozen=True)
class _Toy(Config):
    steps: int = setting(3, "steps", ge=1)
    rate: float = setting(0.5, "a rate", gt=0, le=1)
    mode: str = setting("a", "a mode", choices=("a", "b"))
    sizes: tuple[int, ...] = setting((4,), "sizes", ge=1)
    cap: float | None = setting(None, "a cap", ge=0)
    flag: bool = setting(False, "a flag")

    def check(self) -> None:
        if self.cap is not None and self.cap < self.rate:
            raise self.invalid("cap", f">= rate = {self.rate}")


@dataclasses.dataclass(frozen=True)
class _Preset(_Toy):
    steps: int = 10  # A new default keeps _Toy's help and bounds.


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps=0), "_Toy.steps must be >= 1, got 0"),
    (dict(steps=2.0), "_Toy.steps must be an int >= 1, got 2.0"),
    (dict(steps=True), "_Toy.steps must be an int >= 1, got True"),
    (dict(rate=0.0), "_Toy.rate must be in (0, 1], got 0.0"),
    (dict(rate=float("inf")), "_Toy.rate must be a number in (0, 1], got inf"),
    (dict(mode="c"), "_Toy.mode must be one of 'a', 'b', got 'c'"),
    (dict(sizes=()), "_Toy.sizes must be a non-empty list of ints >= 1, got ()"),
    (dict(sizes=(4, 0)), "_Toy.sizes must be a non-empty list of ints >= 1, got (4, 0)"),
    (dict(cap=-1.0), "_Toy.cap must be >= 0 or None, got -1.0"),
    (dict(flag=1), "_Toy.flag must be true or false, got 1"),
    (dict(cap=0.1), "_Toy.cap must be >= rate = 0.5, got 0.1"),
])
def test_bad_values_name_class_field_requirement_and_value(kwargs, message):
    with pytest.raises(ConfigError) as error:
        _Toy(**kwargs)
    assert str(error.value) == message
    assert error.value.field == next(iter(kwargs))


def test_good_values_and_normalisation():
    toy = _Toy(steps=5, rate=1, sizes=[2, 3], cap=None, flag=True)
    assert toy.sizes == (2, 3) and toy.rate == 1  # A list becomes a tuple; an int is a float.
    hash(toy)


def test_a_redefined_default_keeps_the_base_declaration():
    assert _Preset().steps == 10
    with pytest.raises(ConfigError, match="_Preset.steps must be >= 1, got 0"):
        _Preset(steps=0)
    steps = next(s for s in settings(_Preset) if s.name == "steps")
    assert steps.default == 10 and steps.help == "steps" and steps.requirement() == "an int >= 1"


def test_undeclared_or_unsupported_fields_are_errors():
    @dataclasses.dataclass(frozen=True)
    class Plain(Config):
        n: int = 3

    with pytest.raises(TypeError, match="Plain.n is not declared"):
        Plain()

    @dataclasses.dataclass(frozen=True)
    class Odd(Config):
        d: dict = setting(None, "a dict")

    with pytest.raises(TypeError, match="Odd.d: unsupported setting type"):
        Odd()
