"""The names a user chooses among for radiology reports (data kinds, the model), in a module that imports nothing."""

IU_REPORTS = "iu_reports"  # the Indiana University reports (torchxrayvision's archive by default)
REPORT_CSV = "report_csv"  # a hospital's own reports: a CSV of texts and 0/1 finding columns
REPORT_KINDS: tuple[str, ...] = (IU_REPORTS, REPORT_CSV)
KINDS = REPORT_KINDS  # the data kinds of this modality (modalities)
ARCHITECTURE = "report_mlp"
