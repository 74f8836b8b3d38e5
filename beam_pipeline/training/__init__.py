"""Reading the pipeline's outputs in a training job: numpy and pyarrow only, never Beam."""
