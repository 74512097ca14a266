"""The pass order of ``"auto"`` with and without FP8, and of a written list with ``fp8=...``, pinned by
pass name: the orders below were computed by the pipeline before it became two literal lists
(``with_fp8`` inserting and removing names), so a reordering shows here as a diff, not as a speed change."""

import pytest

import kopt
from kopt.fp8 import Fp8Config
from kopt.passes.pipeline import default_pipeline, fp8_pipeline, resolve

AUTO_FP8 = {('row', False): ['redundancy',
                  'sibling-merge',
                  'fp8-linear',
                  'fuse-activation-quant',
                  'bias-absorption',
                  'fuse-adaln',
                  'fuse-gated-residual',
                  'fuse-adaln-quant',
                  'fuse-qk-norm-rope',
                  'fuse-qk-norm-rope-real',
                  'fuse-joint-attention-input',
                  'fuse-qk-norm-rope-pair',
                  'fp8-gemv',
                  'staging'],
 ('row', True): ['redundancy',
                 'sibling-merge',
                 'fp8-linear',
                 'fuse-activation-quant',
                 'bias-absorption',
                 'fuse-adaln',
                 'fuse-gated-residual',
                 'fuse-adaln-quant',
                 'fuse-qk-norm-rope',
                 'fuse-qk-norm-rope-real',
                 'fuse-joint-attention-input',
                 'fuse-qk-norm-rope-pair',
                 'fp8-attention',
                 'fuse-attention-output-quant',
                 'fp8-gemv',
                 'staging'],
 ('tensor', False): ['redundancy',
                     'sibling-merge',
                     'fp8-linear',
                     'bias-absorption',
                     'fuse-qk-norm-rope',
                     'fuse-qk-norm-rope-real',
                     'fuse-joint-attention-input',
                     'fuse-qk-norm-rope-pair',
                     'staging'],
 ('tensor', True): ['redundancy',
                    'sibling-merge',
                    'fp8-linear',
                    'bias-absorption',
                    'fuse-qk-norm-rope',
                    'fuse-qk-norm-rope-real',
                    'fuse-joint-attention-input',
                    'fuse-qk-norm-rope-pair',
                    'fp8-attention',
                    'staging'],
 ('block-1x128', False): ['redundancy',
                          'sibling-merge',
                          'fp8-linear',
                          'bias-absorption',
                          'fuse-qk-norm-rope',
                          'fuse-qk-norm-rope-real',
                          'fuse-joint-attention-input',
                          'fuse-qk-norm-rope-pair',
                          'staging'],
 ('block-1x128', True): ['redundancy',
                         'sibling-merge',
                         'fp8-linear',
                         'bias-absorption',
                         'fuse-qk-norm-rope',
                         'fuse-qk-norm-rope-real',
                         'fuse-joint-attention-input',
                         'fuse-qk-norm-rope-pair',
                         'fp8-attention',
                         'staging'],
 ('block-128x128', False): ['redundancy',
                            'sibling-merge',
                            'fp8-linear',
                            'bias-absorption',
                            'fuse-qk-norm-rope',
                            'fuse-qk-norm-rope-real',
                            'fuse-joint-attention-input',
                            'fuse-qk-norm-rope-pair',
                            'staging'],
 ('block-128x128', True): ['redundancy',
                           'sibling-merge',
                           'fp8-linear',
                           'bias-absorption',
                           'fuse-qk-norm-rope',
                           'fuse-qk-norm-rope-real',
                           'fuse-joint-attention-input',
                           'fuse-qk-norm-rope-pair',
                           'fp8-attention',
                           'staging']}
LISTED_FP8 = [((), 'row', False, ['fp8-linear', 'fuse-activation-quant', 'fp8-gemv']),
 ((),
  'row',
  True,
  ['fp8-linear', 'fuse-activation-quant', 'fp8-attention', 'fuse-attention-output-quant', 'fp8-gemv']),
 ((), 'tensor', True, ['fp8-linear', 'fp8-attention']),
 (('redundancy', 'sibling-merge', 'bias-absorption', 'fuse-adaln', 'staging'),
  'row',
  False,
  ['redundancy',
   'sibling-merge',
   'fp8-linear',
   'fuse-activation-quant',
   'bias-absorption',
   'fuse-adaln',
   'fp8-gemv',
   'staging']),
 (('redundancy', 'sibling-merge', 'bias-absorption', 'fuse-adaln', 'staging'),
  'row',
  True,
  ['redundancy',
   'sibling-merge',
   'fp8-linear',
   'fuse-activation-quant',
   'bias-absorption',
   'fuse-adaln',
   'fp8-attention',
   'fuse-attention-output-quant',
   'fp8-gemv',
   'staging']),
 (('redundancy', 'sibling-merge', 'bias-absorption', 'fuse-adaln', 'staging'),
  'tensor',
  True,
  ['redundancy', 'sibling-merge', 'fp8-linear', 'bias-absorption', 'fuse-adaln', 'fp8-attention', 'staging']),
 (('fuse-adaln', 'fuse-gated-residual', 'staging'),
  'row',
  False,
  ['fp8-linear', 'fuse-activation-quant', 'fuse-adaln', 'fuse-gated-residual', 'fp8-gemv', 'staging']),
 (('fuse-adaln', 'fuse-gated-residual', 'staging'),
  'row',
  True,
  ['fp8-linear',
   'fuse-activation-quant',
   'fuse-adaln',
   'fuse-gated-residual',
   'fp8-attention',
   'fuse-attention-output-quant',
   'fp8-gemv',
   'staging']),
 (('fuse-adaln', 'fuse-gated-residual', 'staging'),
  'tensor',
  True,
  ['fp8-linear', 'fuse-adaln', 'fuse-gated-residual', 'fp8-attention', 'staging']),
 (('staging', 'fp8-linear'), 'row', False, ['fp8-gemv', 'staging', 'fp8-linear', 'fuse-activation-quant']),
 (('staging', 'fp8-linear'),
  'row',
  True,
  ['fp8-attention', 'fuse-attention-output-quant', 'fp8-gemv', 'staging', 'fp8-linear', 'fuse-activation-quant']),
 (('staging', 'fp8-linear'), 'tensor', True, ['fp8-attention', 'staging', 'fp8-linear']),
 (('fuse-activation-quant', 'bias-absorption'),
  'row',
  False,
  ['fp8-linear', 'fuse-activation-quant', 'bias-absorption', 'fp8-gemv']),
 (('fuse-activation-quant', 'bias-absorption'),
  'row',
  True,
  ['fp8-linear',
   'fuse-activation-quant',
   'bias-absorption',
   'fp8-attention',
   'fuse-attention-output-quant',
   'fp8-gemv']),
 (('fuse-activation-quant', 'bias-absorption'), 'tensor', True, ['fp8-linear', 'bias-absorption', 'fp8-attention']),
 (('fp8-attention', 'fp8-gemv', 'codegen-fuse'),
  'row',
  False,
  ['fp8-attention', 'fp8-gemv', 'codegen-fuse', 'fp8-linear', 'fuse-activation-quant']),
 (('fp8-attention', 'fp8-gemv', 'codegen-fuse'),
  'row',
  True,
  ['fp8-gemv',
   'codegen-fuse',
   'fp8-linear',
   'fuse-activation-quant',
   'fp8-attention',
   'fuse-attention-output-quant']),
 (('fp8-attention', 'fp8-gemv', 'codegen-fuse'),
  'tensor',
  True,
  ['fp8-gemv', 'codegen-fuse', 'fp8-linear', 'fp8-attention'])]
AUTO = ['redundancy',
 'split-concat-linear',
 'sibling-merge',
 'bias-absorption',
 'fuse-adaln',
 'fuse-gated-residual',
 'fuse-qk-norm-rope',
 'fuse-qk-norm-rope-real',
 'fuse-joint-attention-input',
 'fuse-qk-norm-rope-pair',
 'residual-fp32',
 'fuse-linear-gelu',
 'staging']


def test_auto_is_the_default_pipeline():
    assert [p.name for p in default_pipeline()] == AUTO == [p.name for p in resolve("auto")]


@pytest.mark.parametrize(("granularity", "attention"), list(AUTO_FP8))
def test_fp8_pipeline_order(granularity, attention):
    config = Fp8Config(granularity=granularity, attention=attention)
    assert [p.name for p in fp8_pipeline(config)] == AUTO_FP8[granularity, attention]
    assert [p.name for p in resolve("auto", config)] == AUTO_FP8[granularity, attention]


@pytest.mark.parametrize(("listed", "granularity", "attention", "expected"), LISTED_FP8)
def test_fp8_added_to_a_written_list(listed, granularity, attention, expected):
    config = Fp8Config(granularity=granularity, attention=attention)
    assert [p.name for p in resolve(list(listed), config)] == expected


def test_fp8_passes_carry_the_config():
    config = Fp8Config(granularity="tensor", attention=True, min_features=16)
    configured = {p.name: p for p in resolve([], config)}
    assert configured["fp8-linear"].config is config and configured["fp8-attention"].config is config
    assert {p.name for p in fp8_pipeline(config)} <= set(kopt.available_passes())


def test_the_passes_added_by_name_are_the_opt_ins_but_the_fp8_ones():
    """One list for the agent's "add <pass>" choices and dit.py's rows: FP8 passes come with ``fp8=...``."""
    from kopt.agent.propose.pipeline import added_passes, base_pipeline
    from kopt.passes.pipeline import added_by_name, opt_in_passes

    assert added_by_name() == ["codegen-fuse", "fuse-attention"]
    assert set(added_by_name()) < {p.name for p in opt_in_passes()}
    assert [c.change for c in added_passes(base_pipeline())] == [f"add {n}" for n in added_by_name()]
