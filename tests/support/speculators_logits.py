"""Run inside a venv with speculators 0.9.0 (tests/training/test_eagle3_export.py's slow test):
load an exported EAGLE-3 folder with speculators' own `Eagle3DraftModel.from_pretrained`, run its
training-time-test forward (`ttt_steps` steps, teacher-forced) on the target hidden states and
tokens saved beside it, and save every step's lm_head output (its logits over the draft vocabulary).

    python speculators_logits.py FOLDER INPUTS.safetensors OUT.safetensors STEPS
"""

import sys

import torch
from safetensors.torch import load_file, save_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def main(folder: str, inputs: str, out: str, steps: int) -> None:
    config = Eagle3SpeculatorConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"  # dense masks: runs on the CPU
    model = Eagle3DraftModel.from_pretrained(folder, config=config).double().eval()
    saved = load_file(inputs)
    logits = []
    model.lm_head.register_forward_hook(lambda module, args, output: logits.append(output.detach().clone()))
    with torch.no_grad():
        model(hidden_states=saved["hidden_states"].double(), input_ids=saved["input_ids"],
              document_ids=torch.zeros_like(saved["input_ids"]), position_ids=saved["position_ids"], ttt_steps=steps)
    names = {f"step_{j}": t for j, t in enumerate(logits)}
    save_file(names, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
