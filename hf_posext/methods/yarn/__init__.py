"""YaRN (``yarn``) and dynamic YaRN (``dynamic_yarn``, its own rope type): Peng et al. 2023; docs/methods/yarn.md."""

from ...rope_utils import DYNAMIC_YARN_ROPE_TYPE
from ..dynamic import DynamicSurgery
from ..proportional import PROPORTIONAL_ROPE_TYPES
from ..registry import MethodSpec, RopeType, register_family
from .config import DynamicYarnConfig, YarnConfig
from .rope import compute_dynamic_yarn_parameters, validate_dynamic_yarn_parameters

register_family(
    "yarn",
    methods=[MethodSpec("yarn", YarnConfig), MethodSpec("dynamic_yarn", DynamicYarnConfig, surgery=DynamicSurgery)],
    rope_types={
        DYNAMIC_YARN_ROPE_TYPE: RopeType(
            compute_dynamic_yarn_parameters, validate_dynamic_yarn_parameters, old_names=("hf_posext_dynamic_yarn",)
        ),
        **PROPORTIONAL_ROPE_TYPES,
    },
)

__all__ = ["DynamicYarnConfig", "YarnConfig"]
