"""Generation backends behind one interface (base.Backend): vLLM and Transformers."""
