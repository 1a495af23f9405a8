"""TensorFlow SavedModels -> recserve model dirs (DESIGN §4c).

`converted_model_dir` is what the serving process calls: it never imports TensorFlow; the
conversion runs in a subprocess (`python -m recserve.convert`) and is cached on disk
(recserve.model_store.savedmodel_conversion: the model store asks for it at load).
"""

from recserve.model_store.savedmodel_conversion import converted_model_dir, run_conversion

__all__ = ["converted_model_dir", "run_conversion"]
