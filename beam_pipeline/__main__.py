from beam_pipeline.pipeline import main

main()
