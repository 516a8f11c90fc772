"""GPU validation: `bash tools/gpu/gpu_check.sh` (a GPU machine with only torch and transformers installed) and
`bash tools/gpu/gpu_check_vllm.sh` (the full stack); docs/GPU.md says what each measures."""
