package types

import (
	"slices"
	"strings"
)

// Recurring jobs pick volumes by label, as Longhorn's do, under Strata's
// names (docs/recurring-jobs.md):
//
//	recurring-job.strata.io/<job>: enabled          the job <job> runs on the volume
//	recurring-job-group.strata.io/<group>: enabled  every job listing <group> in spec.groups does
//
// A volume carrying no label with either prefix, whatever its value, is in
// the group "default"; so any such label, even one set to "disabled", takes
// a volume out of the default group.
const (
	RecurringJobLabelPrefix      = "recurring-job.strata.io/"
	RecurringJobGroupLabelPrefix = "recurring-job-group.strata.io/"
	// RecurringJobLabelEnabled is the value that selects a volume.
	RecurringJobLabelEnabled = "enabled"
	// RecurringJobDefaultGroup holds every volume without recurring-job labels.
	RecurringJobDefaultGroup = "default"

	// LabelRecurringJob marks the snapshots and backups a recurring job made
	// with the job's name: retention counts them, and a renamed job's
	// leftovers go with one `kubectl delete snap -l strata.io/recurring-job=<old>`.
	LabelRecurringJob = "strata.io/recurring-job"
)

// RecurringJobVolumeLabel is the label that puts a volume under job.
func RecurringJobVolumeLabel(job string) string { return RecurringJobLabelPrefix + job }

// RecurringJobGroupLabel is the label that puts a volume in group.
func RecurringJobGroupLabel(group string) string { return RecurringJobGroupLabelPrefix + group }

// Keys of the volume index by recurring-job selection: one per job and per
// group that selects the volume.
func RecurringJobSelectorKey(job string) string        { return "job/" + job }
func RecurringJobGroupSelectorKey(group string) string { return "group/" + group }

// RecurringJobSelectors lists the index keys under which a volume with the
// given labels is found: each job and group enabled on it, or the default
// group when it carries no recurring-job label at all. Sorted.
func RecurringJobSelectors(labels map[string]string) []string {
	var keys []string
	labelled := false
	for k, v := range labels {
		job, isJob := strings.CutPrefix(k, RecurringJobLabelPrefix)
		group, isGroup := strings.CutPrefix(k, RecurringJobGroupLabelPrefix)
		labelled = labelled || isJob || isGroup
		switch {
		case v != RecurringJobLabelEnabled:
		case isJob && job != "":
			keys = append(keys, RecurringJobSelectorKey(job))
		case isGroup && group != "":
			keys = append(keys, RecurringJobGroupSelectorKey(group))
		}
	}
	if !labelled {
		keys = append(keys, RecurringJobGroupSelectorKey(RecurringJobDefaultGroup))
	}
	slices.Sort(keys)
	return keys
}

// RecurringJobSelects tells whether a job with the given groups runs on a
// volume with the given labels.
func RecurringJobSelects(job string, groups []string, volumeLabels map[string]string) bool {
	for _, k := range RecurringJobSelectors(volumeLabels) {
		if k == RecurringJobSelectorKey(job) {
			return true
		}
		for _, g := range groups {
			if k == RecurringJobGroupSelectorKey(g) {
				return true
			}
		}
	}
	return false
}
