package engine

// DefaultAutoThreshold is the largest message the Auto policy sends over
// UD; larger ones go over RC.
const DefaultAutoThreshold = 1024
