// Package recurringjob holds the RecurringJob admission rules
// (docs/recurring-jobs.md): the schedule parses as the controller parses
// it, retain and concurrency are in bounds, and every name the job puts on
// volumes, snapshots and backups as a label is a valid one.
package recurringjob

import (
	"maps"
	"slices"
	"strings"

	"github.com/robfig/cron/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

// Resource is strata.io/v1beta1 recurringjobs.
var Resource = admission.Resource{
	GroupResource: v1beta1.Resource("recurringjobs"),
	Version:       v1beta1.SchemeGroupVersion.Version,
	Kind:          "RecurringJob",
	NewObject:     func() runtime.Object { return &v1beta1.RecurringJob{} },
}

// MaxRetain is the CRD's bound, repeated so a job is judged in one place.
const MaxRetain = 250

var (
	namePath        = field.NewPath("metadata", "name")
	specPath        = field.NewPath("spec")
	taskPath        = specPath.Child("task")
	cronPath        = specPath.Child("cron")
	retainPath      = specPath.Child("retain")
	concurrencyPath = specPath.Child("concurrency")
	groupsPath      = specPath.Child("groups")
	labelsPath      = specPath.Child("labels")
)

type validator struct{}

// NewValidator returns the RecurringJob validator; every rule reads only
// the object.
func NewValidator() admission.Validator { return validator{} }

func (validator) Resource() admission.Resource { return Resource }

func (validator) Create(_ *admission.Request, obj runtime.Object) error {
	return validJob(obj.(*v1beta1.RecurringJob))
}

// Update judges the whole job; one being deleted is let through so its
// finalizers can always go. Status writes never come here.
func (validator) Update(_ *admission.Request, _, newObj runtime.Object) error {
	job := newObj.(*v1beta1.RecurringJob)
	if job.DeletionTimestamp != nil {
		return nil
	}
	return validJob(job)
}

func validJob(job *v1beta1.RecurringJob) error {
	var errs admission.FieldErrors
	errs.Add(validName(job.Name)...)
	errs.Add(validTask(job.Spec.Task))
	if _, err := cron.ParseStandard(job.Spec.Cron); err != nil {
		errs.Add(admission.Invalid(cronPath, "%q is not a cron schedule (five fields, or a descriptor such as @daily "+
			"or @every 1h): %v", job.Spec.Cron, err))
	}
	errs.Add(validRetain(job.Spec.Task, job.Spec.Retain))
	if job.Spec.Concurrency < 0 {
		errs.Add(admission.Invalid(concurrencyPath, "must be at least 1 (0 or unset means 1), got %d", job.Spec.Concurrency))
	}
	errs.Add(validGroups(job.Spec.Groups)...)
	errs.Add(validLabels(job.Spec.Labels)...)
	return errs.Err()
}

// validName: the job's name is the value of strata.io/recurring-job on its
// snapshots and backups, and the name part of the volume label
// recurring-job.strata.io/<job>, so it must be valid as both.
func validName(name string) []*admission.FieldError {
	var errs []*admission.FieldError
	if msgs := validation.IsValidLabelValue(name); len(msgs) > 0 {
		errs = append(errs, admission.Invalid(namePath, "%q cannot be the value of label %s: %s",
			name, types.LabelRecurringJob, strings.Join(msgs, "; ")))
	} else if msgs := validation.IsQualifiedName(types.RecurringJobVolumeLabel(name)); len(msgs) > 0 {
		errs = append(errs, admission.Invalid(namePath, "%q cannot name the volume label %s: %s",
			name, types.RecurringJobVolumeLabel(name), strings.Join(msgs, "; ")))
	}
	return errs
}

func validTask(task v1beta1.RecurringJobTask) *admission.FieldError {
	switch task {
	case v1beta1.RecurringJobTaskSnapshot, v1beta1.RecurringJobTaskSnapshotGroup, v1beta1.RecurringJobTaskBackup,
		v1beta1.RecurringJobTaskSnapshotDelete, v1beta1.RecurringJobTaskSnapshotCleanup:
		return nil
	}
	return admission.Invalid(taskPath, "%q is not a task: one of snapshot, snapshot-group, backup, snapshot-delete, snapshot-cleanup", task)
}

// validRetain: a snapshot or backup job keeps at least one of what it
// makes (Longhorn's rule: retain 0 would delete each one as it is made);
// snapshot-delete may keep 0 (delete every user snapshot); retain means
// nothing to snapshot-cleanup, so it must stay 0 rather than suggest it does.
func validRetain(task v1beta1.RecurringJobTask, retain int32) *admission.FieldError {
	switch {
	case retain < 0 || retain > MaxRetain:
		return admission.Invalid(retainPath, "must be between 0 and %d, got %d", MaxRetain, retain)
	case retain == 0 && (task == v1beta1.RecurringJobTaskSnapshot || task == v1beta1.RecurringJobTaskSnapshotGroup ||
		task == v1beta1.RecurringJobTaskBackup):
		return admission.Invalid(retainPath, "a %s job must keep at least 1, got 0", task)
	case retain != 0 && task == v1beta1.RecurringJobTaskSnapshotCleanup:
		return admission.Invalid(retainPath, "snapshot-cleanup keeps no count of anything: leave it 0, got %d", retain)
	}
	return nil
}

// validGroups: each group is the name part of the volume label
// recurring-job-group.strata.io/<group>.
func validGroups(groups []string) []*admission.FieldError {
	var errs []*admission.FieldError
	seen := map[string]bool{}
	for i, g := range groups {
		path := groupsPath.Index(i)
		if seen[g] {
			errs = append(errs, admission.Invalid(path, "%q is listed twice", g))
			continue
		}
		seen[g] = true
		if msgs := validation.IsQualifiedName(types.RecurringJobGroupLabel(g)); g == "" || len(msgs) > 0 {
			errs = append(errs, admission.Invalid(path, "%q cannot name the volume label %s: %s",
				g, types.RecurringJobGroupLabel(g), strings.Join(append(msgs, nonEmpty(g)...), "; ")))
		}
	}
	return errs
}

func nonEmpty(s string) []string {
	if s == "" {
		return []string{"must not be empty"}
	}
	return nil
}

// validLabels: the labels go on snapshots and backups as Kubernetes
// labels; keys in strata.io/ are Strata's own (the volume, the job).
func validLabels(labels map[string]string) []*admission.FieldError {
	errs := admission.LabelErrors(labelsPath, labels)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if strings.HasPrefix(k, "strata.io/") {
			errs = append(errs, admission.Invalid(labelsPath.Key(k), "keys in strata.io/ are Strata's own (%s, %s)",
				types.LabelVolume, types.LabelRecurringJob))
		}
	}
	return errs
}
