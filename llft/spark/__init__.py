"""The replicated-Spark harness: the Nexmark-style generator and sink, reference and replicated
runs of examples/nexmark_pipeline.py, and the restart-from-checkpoint supervisor baseline."""
