package types

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseDataSource(t *testing.T) {
	tests := []struct {
		in     string
		want   DataSource
		wantOK bool
	}{
		{in: "snap://v1/s1", want: DataSource{Volume: "v1", Snapshot: "s1"}, wantOK: true},
		{in: "vol://v1", want: DataSource{Volume: "v1"}, wantOK: true},
		{in: "snap://v1"},
		{in: "snap://v1/"},
		{in: "snap:///s1"},
		{in: "snap://v1/s1/x"},
		{in: "vol://"},
		{in: "vol://v1/s1"},
		{in: "http://x"},
		{in: "v1"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := ParseDataSource(tc.in)
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.want, got)
			if ok {
				assert.Equal(t, tc.in, got.String(), "String gives the spec form back")
			}
		})
	}
}
