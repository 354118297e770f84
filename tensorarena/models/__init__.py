"""Model families, one file each with a config dataclass."""

from .bert import BertConfig, BertModel, load_hf_state_dict, to_hf_state_dict
from .mlp import MLP, MLPConfig
from .vit import ViT, ViTConfig

__all__ = ["MLP", "MLPConfig", "BertConfig", "BertModel", "load_hf_state_dict", "to_hf_state_dict", "ViT",
           "ViTConfig"]
