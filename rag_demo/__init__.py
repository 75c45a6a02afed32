"""rag-demo: a provenance explorer for Retrieval-Augmented Generation (Lewis et al., 2020).

Importing the package loads no model and touches no file; see `rag_demo.engine.RagEngine`.
"""

__version__ = "0.1.0"
