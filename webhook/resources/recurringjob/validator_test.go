package recurringjob

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
)

// job is a valid snapshot job; change edits it.
func job(change func(*v1beta1.RecurringJob)) *v1beta1.RecurringJob {
	j := &v1beta1.RecurringJob{ObjectMeta: metav1.ObjectMeta{Name: "daily", Namespace: admissiontest.Namespace},
		Spec: v1beta1.RecurringJobSpec{Task: v1beta1.RecurringJobTaskSnapshot, Cron: "0 2 * * *", Retain: 7,
			Concurrency: 2, Groups: []string{"default", "gold"}, Labels: map[string]string{"team": "db"}}}
	if change != nil {
		change(j)
	}
	return j
}

func task(t v1beta1.RecurringJobTask, retain int32) func(*v1beta1.RecurringJob) {
	return func(j *v1beta1.RecurringJob) { j.Spec.Task, j.Spec.Retain = t, retain }
}

// Every case is judged on create and, as an edit of the valid job, on update.
func TestValidator(t *testing.T) {
	tests := []struct {
		name    string
		obj     *v1beta1.RecurringJob
		wantMsg string
	}{
		{name: "a snapshot job", obj: job(nil)},
		{name: "a backup job every minute", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Task, j.Spec.Cron = "backup", "* * * * *" })},
		{name: "a descriptor", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Cron = "@every 1h30m" })},
		{name: "snapshot-delete keeping none", obj: job(task(v1beta1.RecurringJobTaskSnapshotDelete, 0))},
		{name: "snapshot-cleanup", obj: job(task(v1beta1.RecurringJobTaskSnapshotCleanup, 0))},
		{name: "concurrency unset", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Concurrency = 0 })},
		{name: "a cron of six fields", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Cron = "0 0 2 * * *" }),
			wantMsg: `spec.cron: "0 0 2 * * *" is not a cron schedule (five fields, or a descriptor such as @daily or @every 1h): ` +
				`expected exactly 5 fields, found 6: [0 0 2 * * *]`},
		{name: "a minute out of range", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Cron = "61 * * * *" }),
			wantMsg: `spec.cron: "61 * * * *" is not a cron schedule (five fields, or a descriptor such as @daily or @every 1h): ` +
				`end of range (61) above maximum (59): 61`},
		{name: "a snapshot job keeping none", obj: job(task(v1beta1.RecurringJobTaskSnapshot, 0)),
			wantMsg: `spec.retain: a snapshot job must keep at least 1, got 0`},
		{name: "a backup job keeping none", obj: job(task(v1beta1.RecurringJobTaskBackup, 0)),
			wantMsg: `spec.retain: a backup job must keep at least 1, got 0`},
		{name: "retain above the bound", obj: job(task(v1beta1.RecurringJobTaskBackup, 251)),
			wantMsg: `spec.retain: must be between 0 and 250, got 251`},
		{name: "snapshot-cleanup with a retain", obj: job(task(v1beta1.RecurringJobTaskSnapshotCleanup, 3)),
			wantMsg: `spec.retain: snapshot-cleanup keeps no count of anything: leave it 0, got 3`},
		{name: "an unknown task", obj: job(task("snapshot-force-create", 3)),
			wantMsg: `spec.task: "snapshot-force-create" is not a task: one of snapshot, snapshot-group, backup, snapshot-delete, snapshot-cleanup`},
		{name: "a negative concurrency", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Concurrency = -1 }),
			wantMsg: `spec.concurrency: must be at least 1 (0 or unset means 1), got -1`},
		{name: "a group that cannot be a label", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Groups = []string{"Gold Tier"} }),
			wantMsg: `spec.groups[0]: "Gold Tier" cannot name the volume label recurring-job-group.strata.io/Gold Tier: ` +
				`name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric ` +
				`character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`},
		{name: "an empty group", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Groups = []string{""} }),
			wantMsg: `spec.groups[0]: "" cannot name the volume label recurring-job-group.strata.io/: ` +
				`name part must be non-empty; name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end ` +
				`with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is ` +
				`'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]'); must not be empty`},
		{name: "a group twice", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Groups = []string{"gold", "gold"} }),
			wantMsg: `spec.groups[1]: "gold" is listed twice`},
		{name: "a label value too long", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Labels = map[string]string{"k": strings.Repeat("v", 64)} }),
			wantMsg: `spec.labels[k]: invalid value "` + strings.Repeat("v", 64) + `": must be no more than 63 bytes`},
		{name: "a label of Strata's", obj: job(func(j *v1beta1.RecurringJob) { j.Spec.Labels = map[string]string{"strata.io/volume": "v2"} }),
			wantMsg: `spec.labels[strata.io/volume]: keys in strata.io/ are Strata's own (strata.io/volume, strata.io/recurring-job)`},
		{name: "a name too long for a label value", obj: job(func(j *v1beta1.RecurringJob) { j.Name = strings.Repeat("a", 64) }),
			wantMsg: `metadata.name: "` + strings.Repeat("a", 64) + `" cannot be the value of label strata.io/recurring-job: ` +
				`must be no more than 63 bytes`},
		{name: "every mistake at once, in field order", obj: job(func(j *v1beta1.RecurringJob) {
			j.Spec.Cron, j.Spec.Retain, j.Spec.Concurrency = "@yearly daily", 0, -2
		}),
			wantMsg: `spec.cron: "@yearly daily" is not a cron schedule (five fields, or a descriptor such as @daily or @every 1h): ` +
				`unrecognized descriptor: @yearly daily; spec.retain: a snapshot job must keep at least 1, got 0; ` +
				`spec.concurrency: must be at least 1 (0 or unset means 1), got -2`},
	}
	h := admissiontest.NewHandler(t, nil, NewValidator())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for op, old := range map[string]*v1beta1.RecurringJob{"create": nil, "update": job(func(j *v1beta1.RecurringJob) { j.Name = tc.obj.Name })} {
				resp := h.Validate(admissiontest.Request(Resource, admissiontest.Admin, old, tc.obj))
				assert.Equal(t, tc.wantMsg, admissiontest.Denial(resp), op)
				if tc.wantMsg != "" {
					require.NotNil(t, resp.Result)
					assert.Equal(t, int32(http.StatusUnprocessableEntity), resp.Result.Code, op)
				}
			}
		})
	}
}

// A job being deleted may lose its finalizers whatever it holds.
func TestValidatorLetsDeletingJobsGo(t *testing.T) {
	h := admissiontest.NewHandler(t, nil, NewValidator())
	bad := job(func(j *v1beta1.RecurringJob) {
		j.Spec.Cron = "nope"
		j.DeletionTimestamp = &metav1.Time{Time: time.Unix(1e9, 0)}
		j.Finalizers = []string{"example.com/keep"}
	})
	released := bad.DeepCopy()
	released.Finalizers = nil
	assert.Empty(t, admissiontest.Denial(h.Validate(admissiontest.Request(Resource, admissiontest.Admin, bad, released))))
}
