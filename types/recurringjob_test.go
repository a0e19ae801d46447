package types

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRecurringJobSelectors(t *testing.T) {
	cases := []struct {
		name   string
		labels map[string]string
		want   []string
	}{
		{"no labels: group default", nil, []string{"group/default"}},
		{"other labels only: group default", map[string]string{"app": "db"}, []string{"group/default"}},
		{"a job and a group", map[string]string{RecurringJobVolumeLabel("daily"): "enabled", RecurringJobGroupLabel("gold"): "enabled"},
			[]string{"group/gold", "job/daily"}},
		{"disabled: selected by nothing, and out of default", map[string]string{RecurringJobGroupLabel("default"): "disabled"}, nil},
		{"default named explicitly", map[string]string{RecurringJobGroupLabel("default"): "enabled"}, []string{"group/default"}},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, RecurringJobSelectors(tc.labels), tc.name)
	}
	assert.True(t, RecurringJobSelects("daily", nil, map[string]string{RecurringJobVolumeLabel("daily"): "enabled"}))
	assert.True(t, RecurringJobSelects("x", []string{"default"}, nil))
	assert.False(t, RecurringJobSelects("x", []string{"gold"}, nil))
}
