"""Reading inputs, writing outputs and the manifest."""
