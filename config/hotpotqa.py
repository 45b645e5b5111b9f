"""HotpotQA in the distractor setting, added after a model preset (real text needs a pretrained
model; the Qwen preset brings Search-R1's RL settings and no warm-up):

    python train.py config/qwen2.5-0.5b-instruct.py config/hotpotqa.py --SEED=0
    python evaluate.py out/qwen2.5-0.5b-hotpotqa              # dev EM and F1, 95% intervals
    python lab/report.py out/qwen2.5-0.5b-hotpotqa --credit   # the report card on supporting facts

Each question searches its own ten paragraphs, and the teacher reads its supporting sentences
(at most two paragraphs x two sentences) before a search. The files as distributed
(docs/real-data.md), here under data/hotpotqa/.
Untested with real weights: the GPU machines here cannot download the model or the data.
"""
DATA = "hotpotqa"
DATA_TRAIN = "data/hotpotqa/hotpot_train_v1.1.json"
DATA_DEV = "data/hotpotqa/hotpot_dev_distractor_v1.json"
OUT_DIR = "out/qwen2.5-0.5b-hotpotqa"
