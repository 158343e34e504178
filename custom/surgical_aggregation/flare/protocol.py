"""Task names and FLModel meta keys shared by the server controller and the client script, and the names the
command line offers for the FLARE layer (this module imports nothing, so the command line stays light)."""

TASK_DESCRIBE = "describe"  # handshake: a site reports its class names and sample count
TASK_TRAIN = "train"
TASK_VALIDATE = "validate"
TASK_SUBMIT_MODEL = "submit_model"  # FLARE's cross-site evaluation of the sites' models (site_to_site_evaluation)
TASK_REFUSED = "refused"  # the end of a job for a site refused at the handshake: the reason, and nothing else
TASK_PUBLISH = "publish"  # the end of a job: the best global model, union head and class names, to every site

META_CLASS_NAMES = "class_names"  # names of the head rows in the params, in row order
META_NUM_SAMPLES = "num_samples"  # training images behind a contribution
META_METHOD = "site_method"  # the method's site-side settings (methods.method_meta)
META_WANT_LABEL_COUNTS = "want_label_counts"  # handshake: the server asks for per-class counts (FedSLD only)
META_LABEL_COUNTS = "label_counts"  # class -> [positives, labelled] on the site's training split
META_WARMUP = "warmup"  # warm up the head (backbone frozen) before this round's training
META_DATA = "data"  # a site's one-line description of its data (no paths, no counts per class)
META_PREPROCESSING = "preprocessing"  # what a site feeds the model (its modality's description)
META_OUTCOME = "last_outcome"  # how its last training result fared: aggregated | rejected | failed | not_received
META_PRIVACY = "privacy"  # a DP-SGD site's training result: epsilon spent, delta, budget, whether it stopped
META_INITIAL_MODEL = "initial_model"  # persistor -> controller: where the initial global model came from
META_VALIDATION_SIZE = "num_val"  # handshake: the validation images a site declares (the floor of its errors)
META_ROUND = "model_round"
# a round's candidates (flare.loop): the one a validate task carries, and the one the site is to compare it with,
# paired over its validation images (the first candidate of the round, when a contribution is left out of it)
META_MODEL_KEY, META_COMPARE_TO = (
    "model_key",
    "compare_to",
)  # which global model a validation or publication carries (-1: before training)
# blind mode: a site's handshake answer (its ciphertext count, the parts it is sent back, the public context) and
# the settings every blind task carries (weighting, head seed, whether the params are the plain initial model)
META_BLIND = "blind"

# How the bundle's code reaches the participants (see flare.recipe) and the bundle's jobs (its recipes).
CODE_DELIVERIES = ("byoc", "preinstalled")
# The tasks whose time a site is given is a job setting: the controller's ``<task>_timeout`` (publication
# shares validation's).
TIMED_TASKS = ("handshake", "train", "validate")
NIH_CHEXPERT, REPORT_LABELING, CXR_CONSORTIUM = BUNDLE_JOBS = ("nih_chexpert", "report_labeling", "cxr_consortium")
SERVER_SITE = "server"  # the server's name in a job's deploy map
JOB_FAILED = (
    "the job cannot go on: "  # the server log's line with the reason a job failed (the simulate command reads it)
)
# How a job treats an unfinished federation of its name saved by an earlier job (the controller's ``resume``):
# continue from its last saved round, from the state saved one round earlier, or start afresh.
RESUME_LATEST, RESUME_BACKUP, RESUME_NEVER = "latest", "backup", "never"
RESUME_CHOICES = (RESUME_LATEST, RESUME_BACKUP, RESUME_NEVER)
# The job's label aliases (the consortium's), in each site app's config/ folder; the server has them inline.
JOB_ALIASES_FILE = "label_aliases.json"
